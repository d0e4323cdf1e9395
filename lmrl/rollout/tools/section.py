"""The `tools` config section (`tools=`, `env=`, `tool_parser=`, ...) and what it builds: an environment factory.

Shared by `lmrl rl`, `lmrl sft`, `lmrl generate` and `lmrl eval`. Everything is checked at start-up: unknown
tools, parsers or options, an env path that does not import, an MCP server command that does not resolve (when the
config is read) or a server that does not start (`start_servers`, before any model loads).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from lmrl.config import ConfigError, Section, check_at_least, field, section_view
from lmrl.rollout.tools.env import EnvFactory, checked_factory, tool_env_factory
from lmrl.rollout.tools.parsers import TOOL_PARSERS, get_parser
from lmrl.rollout.tools.toolbox import ToolBox, build_tools, import_callable

if TYPE_CHECKING:
    from lmrl.rollout.tools.multiturn import MultiTurnOptions


@dataclasses.dataclass
class ToolSection(Section):
    title = "tools (multi-turn)"
    tools: list[str] = field(
        [],
        "tools the model may call: calculator, python, or module.path:factory (a Tool); "
        "non-empty turns on the multi-turn tool loop",
    )
    tool_kwargs: dict = field({}, "options per tool, e.g. {python: {timeout_s: 5, memory_mb: 256}}")
    mcp_servers: list[str] = field(
        [],
        "MCP servers over stdio whose tools are added, each a command line; "
        "`python` runs lmrl's interpreter (needs the `tools` extra: "
        "pip install 'lmrl[tools]')",
    )
    env: str | None = field(
        None,
        "a multi-turn environment factory module.path:factory, row -> Environment "
        "(default with tools: the tool environment)",
    )
    tool_parser: str = field("hermes", f"tool-call format: {', '.join(TOOL_PARSERS)}")
    max_turns: int = field(4, "assistant turns per episode")
    max_total_tokens: int = field(256, "token budget of a whole trajectory's completion (turns + tool outputs)")
    train_tool_calls: bool = field(True, "learn the tool-call tokens (false: mask them like tool outputs)")
    max_tool_output_chars: int = field(1000, "tool outputs longer than this are cut with a marker (and counted)")
    system_prompt: str | None = field(None, "system message of tool episodes (the template lists the tools in it)")

    def __post_init__(self) -> None:
        if self.tool_parser not in TOOL_PARSERS:
            raise ConfigError(
                f"tool_parser={self.tool_parser!r} is not a known format; use one of {sorted(TOOL_PARSERS)}."
            )
        check_at_least(self, ("max_turns", "max_total_tokens", "max_tool_output_chars"), 1)
        if self.mcp_servers:
            from lmrl.rollout.tools.mcp import NO_SDK, sdk_installed, server_command

            if not sdk_installed():
                raise ConfigError(NO_SDK)
            try:
                for line in self.mcp_servers:
                    server_command(line)
            except ValueError as exc:
                raise ConfigError(f"mcp_servers: {exc}") from None
        super().__post_init__()

    @property
    def multi_turn(self) -> bool:
        """Whether rollouts run the multi-turn loop (tools, MCP servers or an environment are set)."""
        return bool(self.tools or self.mcp_servers or self.env)

    @property
    def tool_setup(self) -> ToolSection:
        return section_view(self, ToolSection)

    def turn_options(self) -> MultiTurnOptions:
        from lmrl.rollout.tools.multiturn import MultiTurnOptions  # here: configs check without torch (lmrl.cli)

        return MultiTurnOptions(
            self.max_turns, self.max_total_tokens, self.train_tool_calls, get_parser(self.tool_parser)
        )


def build_env_factory(section: ToolSection, tokenizer: Any) -> EnvFactory | None:
    """The environment factory of a config (None: single-turn), with the tokenizer's template made tool-ready."""
    if not section.multi_turn:
        return None
    from lmrl.data.tool_chat import ensure_tool_template

    ensure_tool_template(tokenizer)
    if section.env:
        try:
            return checked_factory(import_callable(section.env, "env"), section.env)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    try:
        tools = build_tools(section.tools, section.tool_kwargs)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    tools += start_servers(section)
    return tool_env_factory(
        ToolBox(tools, section.max_tool_output_chars), get_parser(section.tool_parser), section.system_prompt
    )


def start_servers(section: ToolSection) -> list:
    """Start the config's MCP servers (each once per process: `build_env_factory` reuses them) and return their
    tools; called before a model loads, so a server that does not start stops the run at once, naming it."""
    if not section.mcp_servers:
        return []
    from lmrl.rollout.tools.mcp import mcp_tools, server_command

    try:
        return [tool for line in section.mcp_servers for tool in mcp_tools(server_command(line))]
    except ValueError as exc:
        raise ConfigError(f"mcp_servers: {exc}") from None
