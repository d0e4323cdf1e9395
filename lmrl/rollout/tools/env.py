"""The environment protocol of multi-turn rollouts, and `ToolEnv`, the environment of tool use.

An environment runs one episode (one trajectory); the tool loop makes one per trajectory with a factory
`make_env(row) -> Environment`:

    messages = env.reset(row)                 # the conversation the model answers first
    result = env.step({"role": "assistant", "content": text})
    result.observations, result.reward, result.done     # messages appended before the next turn

`ToolEnv` parses the assistant's calls with a `ToolParser`, runs them in a `ToolBox` and returns one `tool`
message per call; a message with no call (and no malformed call) is the final answer and ends the episode.
Malformed calls, unknown tools, tools that raise and oversized outputs become error observations and are
counted in `stats`, never exceptions. A user environment is any object with `tools`, `reset`, `step`
(and optionally `stats`), given as `env=module.path:factory`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from lmrl.rollout.tools.parsers import ToolParser
from lmrl.rollout.tools.toolbox import ToolBox


@dataclasses.dataclass
class StepResult:
    """What an environment returns for one assistant message."""

    observations: list[dict[str, Any]]
    """messages to append (role "tool" or "user") before the model's next turn"""
    reward: float = 0.0
    """reward of this step; the `env` reward sums them over the episode"""
    done: bool = False


class Environment(Protocol):
    """One episode of a multi-turn task."""

    tools: list[dict[str, Any]]
    """tool schemas (OpenAI function format) given to the chat template; [] for none"""

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]: ...

    def step(self, message: dict[str, Any]) -> StepResult: ...


EnvFactory = Callable[[dict[str, Any]], Environment]

STAT_KEYS = ("calls", "call_errors", "parse_errors", "unknown_tool", "tool_errors", "output_truncated")
"""Counters every `ToolEnv` keeps (summed over a batch into `rollout/tools/<key>_per_episode` metrics)."""


def initial_messages(row: dict[str, Any], system_prompt: str | None = None) -> list[dict[str, Any]]:
    """The conversation of a row: its `prompt` as a user message (or its prompt messages), after an optional
    system prompt."""
    prompt = row.get("prompt")
    if prompt is None:
        raise ValueError(f"a multi-turn row needs a 'prompt' column (text or messages); found {sorted(row)}.")
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


class ToolEnv:
    """Tool use: answer calls with tool messages until the model answers without a call."""

    def __init__(self, toolbox: ToolBox, parser: ToolParser, system_prompt: str | None = None):
        self.toolbox, self.parser, self.system_prompt = toolbox, parser, system_prompt
        self.tools = toolbox.schemas()
        self.stats = dict.fromkeys(STAT_KEYS, 0)

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return initial_messages(row, self.system_prompt)

    def step(self, message: dict[str, Any]) -> StepResult:
        parsed = self.parser.parse(message.get("content") or "")
        observations = []
        for error in parsed.errors:
            self.stats["parse_errors"] += 1
            self.stats["call_errors"] += 1
            observations.append({"role": "tool", "content": f"Error: malformed tool call: {error}"})
        for call in parsed.calls:
            self.stats["calls"] += 1
            result = self.toolbox.execute(call)
            if result.error is not None:
                self.stats["call_errors"] += 1
                self.stats["unknown_tool" if result.error.startswith("unknown tool") else "tool_errors"] += 1
            self.stats["output_truncated"] += int(result.truncated)
            observations.append(
                {
                    "role": "tool",
                    "content": result.content,
                    "name": call.name,
                    "tool_call_id": call.id or f"call_{self.stats['calls']}",
                }
            )
        return StepResult(observations, 0.0, done=not observations)


def tool_env_factory(toolbox: ToolBox, parser: ToolParser, system_prompt: str | None = None) -> EnvFactory:
    """A factory of fresh `ToolEnv`s sharing one toolbox."""

    def make(row: dict[str, Any]) -> ToolEnv:
        return ToolEnv(toolbox, parser, system_prompt)

    return make


def checked_factory(factory: EnvFactory, name: str) -> EnvFactory:
    """A user's environment factory (``env=module.path:factory``) whose environments are checked against the
    `Environment` protocol at every call (`CheckedEnv`)."""

    def make(row: dict[str, Any]) -> CheckedEnv:
        return CheckedEnv(factory(row), name)

    return make


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)


class CheckedEnv:
    """A user environment behind the protocol's checks: the first ``tools``, ``reset`` or ``step`` that breaks the
    contract raises a ValueError naming the environment and the contract, not a traceback deep in the rollout.
    Other attributes (``stats``) are the environment's own."""

    def __init__(self, env: Any, name: str):
        self._env, self._name = env, name
        tools = getattr(env, "tools", None)
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise self._broken(
                f"its `tools` is {_shown(tools)}; it must be a list of tool schemas (OpenAI function "
                "format), [] for none"
            )
        self.tools = tools

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._env, attr)

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        messages = self._env.reset(row)
        if not _is_messages(messages) or not messages:
            raise self._broken(
                f"reset(row) returned {_shown(messages)}; it must return the conversation the model "
                "answers first: a non-empty list of messages such as [{'role': 'user', 'content': "
                "'...'}]"
            )
        return messages

    def step(self, message: dict[str, Any]) -> StepResult:
        result = self._env.step(message)
        fields = [getattr(result, f, None) for f in ("observations", "reward", "done")]
        if (
            isinstance(result, tuple)
            or not _is_messages(fields[0])
            or not isinstance(fields[1], (int, float))
            or not isinstance(fields[2], (bool, int))
        ):
            raise self._broken(
                f"step(message) returned {_shown(result)}; it must return a StepResult(observations, "
                "reward, done) (from lmrl.rollout.tools.env import StepResult): observations a list of "
                "messages, reward a number, done a bool"
            )
        return result

    def _broken(self, what: str) -> ValueError:
        return ValueError(
            f"env={self._name}: the environment breaks the Environment protocol (lmrl.rollout.tools.env): "
            f"{what}. See docs/tools.md."
        )


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"
