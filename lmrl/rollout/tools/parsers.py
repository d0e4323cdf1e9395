"""Tool-call formats: find the calls in an assistant message, and write calls in that format (SFT traces).

    parser = get_parser("hermes")
    turn = parser.parse('Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>')
    turn.calls[0].name, turn.calls[0].arguments, turn.errors     # "calculator", {"expression": "2*3"}, []

Formats (`TOOL_PARSERS`):
- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per message (Hermes, Qwen 2.5/3);
- `json`: the whole message is one JSON object `{"name": ..., "arguments": {...}}` or a list of them
  (optionally in a ```json fence); `parameters` is accepted for `arguments` (Llama 3.1 JSON style);
- `pythonic`: the whole message is `[f(a=1, b="x"), g()]` or `f(a=1)`, keyword arguments with literal
  values (Llama 3.2 / 4 pythonic style).

A call that is recognisably a call but cannot be read (bad JSON, no name, positional arguments, an
unclosed tag) is an *error*, never an exception: the tool loop answers it with an error observation and
counts it. Each call and error carries its character span in the message, so the loss mask can find
the call tokens.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Any, ClassVar


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed call: a tool name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry: {"type": "function", "id", "function": {"name", "arguments"}}."""
        return {"type": "function", "id": self.id, "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass
class ParsedMessage:
    """An assistant message split into its text, its calls and the malformed calls."""

    content: str
    """the message without the call text"""
    calls: list[ToolCall]
    errors: list[str]
    """one short reason per malformed call"""
    spans: list[tuple[int, int]]
    """character spans [start, end) of every call, well-formed or not, in the message"""


def _call_from_obj(obj: Any) -> ToolCall | str:
    """A ToolCall from a decoded JSON value, or the reason it is not one."""
    if not isinstance(obj, dict):
        return f"a tool call must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "a tool call needs a non-empty string 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return f"the arguments of '{name}' are not valid JSON ({exc.msg})"
    if not isinstance(args, dict):
        return f"the arguments of '{name}' must be a JSON object, got {type(args).__name__}"
    return ToolCall(name, args)


class ToolParser:
    """A tool-call format: `parse` a message, `format` calls as the model should write them."""

    name: ClassVar[str] = ""

    def parse(self, text: str) -> ParsedMessage:
        raise NotImplementedError

    def format(self, calls: list[ToolCall]) -> str:
        raise NotImplementedError


class HermesParser(ToolParser):
    """`<tool_call>{json}</tool_call>` blocks anywhere in the message (Hermes 2 Pro, Qwen 2.5/3)."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> ParsedMessage:
        calls, errors, spans, kept, pos = [], [], [], [], 0
        for m in self._BLOCK.finditer(text):
            kept.append(text[pos : m.start()])
            pos = m.end()
            spans.append((m.start(), m.end()))
            try:
                result = _call_from_obj(json.loads(m.group(1).strip()))
            except json.JSONDecodeError as exc:
                result = f"the tool call is not valid JSON ({exc.msg} at char {exc.pos})"
            (calls if isinstance(result, ToolCall) else errors).append(result)
        rest = text[pos:]
        if self.OPEN in rest:  # an opened call that never closed (e.g. the turn hit its token limit)
            start = rest.index(self.OPEN)
            spans.append((pos + start, len(text)))
            errors.append(f"the tool call is not closed with {self.CLOSE}")
            rest = rest[:start]
        kept.append(rest)
        return ParsedMessage("".join(kept).strip(), calls, errors, spans)

    def format(self, calls: list[ToolCall]) -> str:
        return "".join(
            f"{self.OPEN}{json.dumps({'name': c.name, 'arguments': c.arguments})}{self.CLOSE}" for c in calls
        )


class JSONParser(ToolParser):
    """The whole message is a call object or a list of call objects, optionally in a ```json fence."""

    name = "json"
    _FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)

    def parse(self, text: str) -> ParsedMessage:
        body = text.strip()
        fence = self._FENCE.match(body)
        if fence:
            body = fence.group(1)
        if not body.startswith(("{", "[")):
            return ParsedMessage(text.strip(), [], [], [])
        span = [(0, len(text))]
        try:
            value = json.loads(body)
        except json.JSONDecodeError as exc:
            if body.startswith("[") and not body.lstrip("[").lstrip().startswith("{"):
                return ParsedMessage(text.strip(), [], [], [])  # a plain JSON list is not a call
            return ParsedMessage("", [], [f"the tool call is not valid JSON ({exc.msg} at char {exc.pos})"], span)
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not all(isinstance(v, dict) for v in value):
            return ParsedMessage(text.strip(), [], [], [])
        calls, errors = [], []
        for item in items:
            result = _call_from_obj(item)
            (calls if isinstance(result, ToolCall) else errors).append(result)
        return ParsedMessage("", calls, errors, span)

    def format(self, calls: list[ToolCall]) -> str:
        objs = [{"name": c.name, "arguments": c.arguments} for c in calls]
        return json.dumps(objs[0] if len(objs) == 1 else objs)


class PythonicParser(ToolParser):
    """The whole message is `[f(a=1), g(b="x")]` or `f(a=1)`; values are Python literals."""

    name = "pythonic"
    _LOOKS_LIKE_CALL = re.compile(r"^\[?\s*[A-Za-z_][\w.]*\s*\(")

    def parse(self, text: str) -> ParsedMessage:
        body = text.strip()
        if not self._LOOKS_LIKE_CALL.match(body):
            return ParsedMessage(body, [], [], [])
        span = [(0, len(text))]
        try:
            tree = ast.parse(body, mode="eval").body
        except SyntaxError as exc:
            return ParsedMessage("", [], [f"the tool call is not valid Python call syntax ({exc.msg})"], span)
        nodes = tree.elts if isinstance(tree, ast.List) else [tree]
        calls, errors = [], []
        for node in nodes:
            result = self._call(node)
            (calls if isinstance(result, ToolCall) else errors).append(result)
        return ParsedMessage("", calls, errors, span)

    @staticmethod
    def _call(node: ast.AST) -> ToolCall | str:
        if not isinstance(node, ast.Call):
            return "each item must be a call like name(arg=value)"
        name = ast.unparse(node.func)
        if node.args:
            return f"'{name}' takes keyword arguments only (name(arg=value))"
        args = {}
        for kw in node.keywords:
            if kw.arg is None:
                return f"'{name}': **kwargs are not allowed"
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, SyntaxError, TypeError):
                return f"'{name}': argument '{kw.arg}' is not a literal value"
        return ToolCall(name, args)

    def format(self, calls: list[ToolCall]) -> str:
        body = ", ".join(f"{c.name}(" + ", ".join(f"{k}={v!r}" for k, v in c.arguments.items()) + ")" for c in calls)
        return f"[{body}]"


TOOL_PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, JSONParser, PythonicParser)}
"""Tool-call formats by name."""


def get_parser(name: str) -> ToolParser:
    """The tool-call format `name`; an unknown name raises with the known ones."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool_parser {name!r}; the formats are {sorted(TOOL_PARSERS)}.")
    return TOOL_PARSERS[name]()
