"""Chat templates with tools: render `tools=` and `tool` messages, the tokens between turns, call-token masks.

The tool loop never re-tokenizes what the model sampled. After an assistant turn it appends the tokens of
the text the chat template puts between that turn's end-of-turn marker and the next generation prompt (the
tool messages, rendered by the template), found with the same prefix property `lmrl.data.chat` uses for SFT
masks: `render(history + [assistant])` is a prefix of `render(history + [assistant] + tools, gen=True)`.

Built-in tokenizers carry ChatML without tools; `ensure_tool_template` swaps in `CHATML_TOOLS_TEMPLATE`,
which renders every tool-free conversation exactly as ChatML does, lists the tools in the system message
and renders `tool` messages as `<|im_start|>tool\\n...<|im_end|>`. HF templates that take `tools=` (Qwen,
Llama 3.1+, Hermes) are used as they are.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from lmrl.data.chat import (
    CHATML_TEMPLATE,
    END_OF_TURN,
    IGNORE_INDEX,
    _encode,
    _prefix_check,
    _turn_end,
    encode_plain,
    has_special_tokens,
    special_strings,
)

DEFUSE = "\u200b"
"""put after the first character of a special-token string in an observation whose text cannot be found in the
template's output (a template that escapes or reshapes it): the string then cannot match"""

CHATML_TOOLS_TEMPLATE = (
    "{{ bos_token if bos_token is defined and bos_token else '' }}"
    "{% set offset = 1 if messages and messages[0]['role'] == 'system' else 0 %}"
    "{% if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if offset %}{{ messages[0]['content'] | trim + '\\n' }}{% endif %}"
    "{{ 'Tools:' }}{% for tool in tools %}{% set f = tool['function'] if 'function' in tool else tool %}"
    "{{ '\\n' + f['name'] + '(' + (f['parameters']['properties'] | list | join(', ') if f['parameters'] is defined "
    "and f['parameters']['properties'] is defined else '') + '): ' + (f['description'] if f['description'] is "
    "defined else '') }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif offset %}{{ '<|im_start|>system\\n' + messages[0]['content'] | trim + '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages[offset:] %}"
    "{% if message['role'] not in ('user', 'assistant', 'tool') %}"
    "{{ raise_exception('Roles after an optional first system message must be user, assistant or tool') }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') | trim + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML with tools: identical to `CHATML_TEMPLATE` without tools or tool messages (a test checks it); with
`tools`, the system message ends with one line per tool, `name(arg, ...): description`; `tool` messages
are `<|im_start|>tool\\n{content}<|im_end|>\\n`. Calls are part of the assistant's content (the model writes
them in its `tool_parser` format)."""


@dataclasses.dataclass(frozen=True)
class ToolContext:
    """How SFT renders and masks tool conversations: the tools (OpenAI schemas), the call format, call tokens."""

    tools: list[dict]
    parser: Any
    """a `lmrl.rollout.tools.parsers.ToolParser` (writes `tool_calls` into the content, finds call spans)"""
    train_calls: bool = True


def ensure_tool_template(tokenizer: Any) -> Any:
    """Give a built-in (ChatML) tokenizer the tool template, and check that the template renders tool turns.

    Raises a ValueError naming the fix when the tokenizer's own template refuses `tool` messages."""
    if getattr(tokenizer, "chat_template", None) in (None, CHATML_TEMPLATE):
        tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    probe = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "2"},
    ]
    try:
        text = render(tokenizer, probe, [], add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - any template error means the same fix
        raise ValueError(
            f"the tokenizer's chat template cannot render tool messages ({type(exc).__name__}: "
            f"{str(exc)[:120]}). Use a model whose template supports tools, or set "
            "chat_template to lmrl.data.tool_chat.CHATML_TOOLS_TEMPLATE."
        ) from None
    if "2" not in text.split("call", 1)[-1]:
        raise ValueError(
            "the tokenizer's chat template drops tool messages; use a template that renders the "
            "`tool` role (e.g. lmrl.data.tool_chat.CHATML_TOOLS_TEMPLATE)."
        )
    return tokenizer


def render(tokenizer: Any, messages: Sequence[dict], tools: Sequence[dict] | None, add_generation_prompt: bool) -> str:
    """The chat template applied to `messages`, with `tools=` when there are tools."""
    extra = {"tools": list(tools)} if tools else {}
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def prompt_ids(tokenizer: Any, messages: Sequence[dict], tools: Sequence[dict] | None) -> list[int]:
    """Tokens of a conversation ready for the assistant's next turn."""
    return _encode(tokenizer, render(tokenizer, messages, tools, add_generation_prompt=True))


def between_turns_ids(
    tokenizer: Any, history: Sequence[dict], assistant: dict, observations: Sequence[dict], tools: Sequence[dict] | None
) -> list[int]:
    """Tokens after the sampled `assistant` turn's end-of-turn marker, through the next generation prompt:
    the rest of the assistant turn as rendered (ChatML: "\\n"), the `observations` and the next
    `<|im_start|>assistant\\n`. `history` ends where the assistant turn started.

    The observations come from outside (tools, MCP servers, environments): their text is tokenized as plain
    text, so `<|im_end|>\\n<|im_start|>assistant` in a tool's output is characters, never the template's control
    tokens (issue 46; `observations_with_special_tokens` counts such observations)."""
    before = render(tokenizer, history, tools, add_generation_prompt=True)
    with_turn = render(tokenizer, [*history, assistant], tools, add_generation_prompt=False)
    after = render(tokenizer, [*history, assistant, *observations], tools, add_generation_prompt=True)
    _prefix_check(with_turn, before, len(history), True)
    _prefix_check(after, with_turn, len(history) + 1, False)
    end = len(before) + _turn_end(tokenizer, with_turn[len(before) :])
    specials = special_strings(tokenizer)
    if not observations_with_special_tokens(observations, specials):
        return _encode(tokenizer, after[end:])
    tail, ids, pos = after[end:], [], 0
    for content in (str(m.get("content") or "") for m in observations):
        if not has_special_tokens([content], specials):
            continue
        found = next((k for k in (tail.find(c, pos) for c in (content, content.strip())) if k >= 0), -1)
        if found < 0:  # the template reshaped the text: render it again with the markers broken
            defused = [{**m, "content": _defuse(str(m.get("content") or ""), specials)} for m in observations]
            if not observations_with_special_tokens(defused, specials):  # else a one-character special token
                return between_turns_ids(tokenizer, history, assistant, defused, tools)
            return _encode(tokenizer, tail)
        text = content if tail.startswith(content, found) else content.strip()
        ids += _encode(tokenizer, tail[pos:found]) + encode_plain(tokenizer, text, specials)
        pos = found + len(text)
    return ids + _encode(tokenizer, tail[pos:])


def observations_with_special_tokens(observations: Sequence[dict], specials: Sequence[str]) -> int:
    """How many observations hold one of the tokenizer's special-token strings."""
    return sum(has_special_tokens([str(m.get("content") or "")], specials) for m in observations)


def _defuse(text: str, specials: Sequence[str]) -> str:
    for s in sorted(specials, key=len, reverse=True):
        text = text.replace(s, s[0] + DEFUSE + s[1:])
    return text


def token_char_ends(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    """For each token, the length of the decoded text (special tokens skipped) up to and including it."""
    ends, last = [], 0
    for i in range(len(ids)):
        last = max(last, len(tokenizer.decode(list(ids[: i + 1]), skip_special_tokens=True)))
        ends.append(last)
    return ends


def span_token_mask(tokenizer: Any, ids: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """True for tokens whose decoded characters overlap one of the character `spans` of decode(ids)."""
    if not spans:
        return [False] * len(ids)
    ends = token_char_ends(tokenizer, ids)
    starts = [0, *ends[:-1]]
    return [any(s < e_span and e > s_span for s_span, e_span in spans) and e > s for s, e in zip(starts, ends)]


def tokenize_tool_conversation(
    tokenizer: Any,
    messages: Sequence[dict],
    tools: Sequence[dict] | None,
    parser: Any = None,
    train_calls: bool = True,
    where: str = "conversation",
) -> tuple[list[int], list[int]]:
    """Input ids and labels of a tool-use conversation for SFT: every assistant turn learned (content and its
    end-of-turn marker), user, system and tool messages never; with train_calls=False, the tokens of the
    calls `parser` finds in an assistant turn are not learned either."""
    validate_tool_messages(messages, where)
    full = render(tokenizer, messages, tools, add_generation_prompt=False)
    input_ids: list[int] = []
    labels: list[int] = []
    pos = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], tools, add_generation_prompt=True)
        after = render(tokenizer, messages[: i + 1], tools, add_generation_prompt=False)
        _prefix_check(full, before, i, True)
        _prefix_check(full, after, i + 1, False)
        start, end = len(before), len(before) + _turn_end(tokenizer, after[len(before) :])
        ids = _encode(tokenizer, full[pos:start])
        input_ids += ids
        labels += [IGNORE_INDEX] * len(ids)
        ids = _encode(tokenizer, full[start:end])
        learned = list(ids)
        if not train_calls and parser is not None:
            text = tokenizer.decode(ids, skip_special_tokens=True)
            mask = span_token_mask(tokenizer, ids, parser.parse(text).spans)
            learned = [IGNORE_INDEX if masked else t for t, masked in zip(ids, mask)]
        input_ids += ids
        labels += learned
        pos = end
    ids = _encode(tokenizer, full[pos:])
    return input_ids + ids, labels + [IGNORE_INDEX] * len(ids)


def validate_tool_messages(messages: Any, where: str) -> None:
    """An optional system message, then a user message, then user/assistant/tool messages, ending with an
    assistant; every tool message follows an assistant or another tool message."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{where}: `messages` must be a non-empty list of {{'role', 'content'}} dicts.")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise ValueError(
                f"{where}: message {j} must be a dict with a 'role' and string 'content', got {str(m)[:80]!r}."
            )
    roles = [m["role"] for m in messages]
    body = roles[1:] if roles[0] == "system" else roles
    bad = [r for r in body if r not in ("user", "assistant", "tool")]
    ok = bool(body) and body[0] == "user" and not bad and body[-1] == "assistant"
    ok = ok and all(body[k - 1] in ("assistant", "tool") for k in range(1, len(body)) if body[k] == "tool")
    if not ok:
        raise ValueError(
            f"{where}: bad role order {roles}. A tool conversation is an optional system message, a "
            "user message, then assistant turns, each optionally followed by tool messages, ending "
            "with an assistant turn."
        )


def tool_row_messages(row: dict, parser: Any) -> list[dict]:
    """The messages of a row, with OpenAI-style `tool_calls` written into the assistant content in the
    parser's format (so the model learns to write them)."""
    messages = row["messages"]
    if isinstance(messages, str):
        messages = json.loads(messages)
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None)
        if calls and parser is not None:
            parsed = [
                SimpleNamespace(
                    name=c["function"]["name"],
                    arguments=c["function"]["arguments"]
                    if isinstance(c["function"]["arguments"], dict)
                    else json.loads(c["function"]["arguments"]),
                )
                for c in calls
            ]
            m["content"] = ((m.get("content") or "") + parser.format(parsed)).strip()
        m["content"] = m.get("content") or ""
        out.append(m)
    return out


def has_tool_turns(row: dict) -> bool:
    """Whether a messages row uses tools (a tool message, tool_calls, or a `tools` column)."""
    if row.get("tools"):
        return True
    messages = row.get("messages")
    if isinstance(messages, str):
        return '"tool' in messages
    return any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages or [])


__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "ToolContext",
    "END_OF_TURN",
    "between_turns_ids",
    "ensure_tool_template",
    "has_tool_turns",
    "prompt_ids",
    "render",
    "span_token_mask",
    "token_char_ends",
    "tokenize_tool_conversation",
    "tool_row_messages",
    "validate_tool_messages",
]
