"""Tools a policy can call: a JSON-schema description (OpenAI function format) and a Python function.

    box = ToolBox([calculator()], max_output_chars=2000)
    box.schemas()                                     # [{"type": "function", "function": {...}}] for tools=
    box.execute(ToolCall("calculator", {"expression": "4821*937"}))   # ToolResult("4517277", error=None)

Built-ins (`BUILTIN_TOOLS`): `calculator` (exact arithmetic on + - * / // % ** and parentheses) and
`python` (runs code in `lmrl.sandbox` and returns what it printed). `execute` never raises: an unknown
tool, arguments that do not fit the schema, a tool that raises and output over `max_output_chars`
(cut, with a marker) all come back as a `ToolResult` whose `error` names the problem.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import math
import operator
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from lmrl.rollout.tools.parsers import ToolCall
from lmrl.sandbox import SandboxLimits, require_isolation, run_python
from lmrl.sandbox.operators import BINARY

_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
    "null": type(None),
}


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable tool: `fn(**arguments) -> str`, described by a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object: {"type": "object", "properties": {...}, "required": [...]}"""
    fn: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        """OpenAI function format, as chat templates take it in `tools=`."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def check_arguments(self, args: dict[str, Any]) -> str | None:
        """Why `args` does not fit the schema (required, unknown and top-level types), or None."""
        props = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", []) if k not in args]
        if missing:
            return f"missing required argument(s) {missing}"
        if self.parameters.get("additionalProperties", True) is False or props:
            unknown = sorted(set(args) - set(props))
            if unknown:
                return f"unknown argument(s) {unknown}; '{self.name}' takes {sorted(props)}"
        for key, value in args.items():
            want = props.get(key, {}).get("type")
            types = _JSON_TYPES.get(want) if isinstance(want, str) else None
            if types is not None and (
                not isinstance(value, types) or (want in ("integer", "number") and isinstance(value, bool))
            ):
                return f"argument '{key}' must be of type {want}, got {type(value).__name__}"
        return None


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """A tool's observation text, and the error that produced it (None: the tool ran)."""

    content: str
    error: str | None = None
    truncated: bool = False


class ToolBox:
    """Tools by name, executed safely: every failure becomes an error observation, and a call that runs longer
    than `timeout_s` is given up on (an error observation; the loop goes on)."""

    def __init__(self, tools: Sequence[Tool], max_output_chars: int = 2000, timeout_s: float = 60.0):
        names = [t.name for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tools: the tool name(s) {dupes} are given twice; every tool needs its own name.")
        if max_output_chars < 1:
            raise ValueError(f"max_tool_output_chars must be >= 1, got {max_output_chars}.")
        if not timeout_s > 0:
            raise ValueError(f"ToolBox timeout_s must be > 0, got {timeout_s}.")
        self.tools = {t.name: t for t in tools}
        self.max_output_chars = max_output_chars
        self.timeout_s = timeout_s

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    def execute(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            close = difflib.get_close_matches(call.name, self.tools, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            return _error(f"unknown tool '{call.name}'; the tools are {sorted(self.tools)}.{hint}")
        problem = tool.check_arguments(call.arguments)
        if problem:
            return _error(f"bad arguments for '{call.name}': {problem}")
        done, outcome = _call_with_timeout(tool.fn, call.arguments, self.timeout_s)
        if not done:
            return _error(f"tool '{call.name}' did not answer within {self.timeout_s:g} s")
        out, exc = outcome
        if exc is not None:  # a tool's failure is the policy's observation, not a crash
            return _error(f"tool '{call.name}' raised {type(exc).__name__}: {str(exc)[:200]}")
        try:
            text = out if isinstance(out, str) else str(out)
        except Exception as exc:  # noqa: BLE001 - a result whose str() fails
            return _error(f"tool '{call.name}' returned an unprintable {type(out).__name__}: {exc}")
        if len(text) > self.max_output_chars:
            cut = len(text) - self.max_output_chars
            return ToolResult(text[: self.max_output_chars] + f"\n...[truncated {cut} characters]", None, True)
        return ToolResult(text)


def _call_with_timeout(fn: Callable[..., Any], arguments: dict[str, Any], timeout_s: float):
    """(finished, (result, exception)): fn runs in a daemon thread, so a hung tool cannot hold the loop (nor
    the interpreter's exit); it cannot be killed, so tools that may hang should bound themselves (the
    sandboxed `python` tool and the calculator do)."""
    outcome: list = []

    def target() -> None:
        try:
            outcome.append((fn(**arguments), None))
        except Exception as exc:  # noqa: BLE001
            outcome.append((None, exc))

    thread = threading.Thread(target=target, name="lmrl-tool", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return (True, outcome[0]) if outcome else (False, None)


def _error(message: str) -> ToolResult:
    return ToolResult(f"Error: {message}", message)


# ----------------------------------------------------------------------------- calculator

_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_DIGITS = 200
"""Results and intermediate values (numerator and denominator) longer than this are refused, and powers are
sized before they are computed, so `9**9**9` or `((1/3)**1000)**1000` cannot hang the loop."""


def calculate(expression: str) -> str:
    """The exact value of an arithmetic expression: integers and decimals, + - * / // % ** and parentheses.

    Division is exact (fractions); a non-integer result is printed as a decimal rounded to 12 digits.
    Raises ValueError on anything else (names, calls, huge powers).
    """
    if not isinstance(expression, str) or not expression.strip() or len(expression) > 500:
        raise ValueError("give an arithmetic expression of at most 500 characters, e.g. '4821*937'")
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _eval(tree)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.12g}"


def _digits(value: Fraction) -> int:
    """Decimal digits of the longer of numerator and denominator (from the bit length: no str of a huge int)."""
    return max(abs(value.numerator).bit_length(), value.denominator.bit_length()) * 30103 // 100000 + 1


def _checked(value: Fraction) -> Fraction:
    if _digits(value) > MAX_DIGITS:
        raise ValueError("the result is too large")
    return value


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ValueError("the number is too large")
        return _checked(Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):  # the result has about |exponent| x digits(base) digits
            if right.denominator != 1 or abs(right) * _digits(left) > 4 * MAX_DIGITS:
                raise ValueError("the power is too large")
            if left == 0 and right < 0:
                raise ValueError("division by zero")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        return _checked(Fraction(BINARY[type(node.op)](left, right)))
    raise ValueError(f"unsupported element {type(node).__name__}: only numbers, + - * / // % ** and ()")


def calculator() -> Tool:
    """The `calculator` tool (`calculate`)."""
    return Tool(
        "calculator",
        "Evaluate an arithmetic expression exactly.",
        {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 4821*937"}},
            "required": ["expression"],
        },
        calculate,
    )


def python_tool(
    timeout_s: float = 10.0, memory_mb: int = 512, max_output_chars: int = 4000, sandbox: str | None = None
) -> Tool:
    """The `python` tool: run a program in the sandbox and return its stdout/stderr (and why it stopped).
    `sandbox: none` opts into the unisolated mode (warns); a machine that cannot isolate fails here."""
    extra = {"isolation": sandbox} if sandbox is not None else {}
    limits = SandboxLimits(
        timeout_s=timeout_s,
        cpu_s=max(1, int(timeout_s)),
        memory_mb=memory_mb,
        max_output_chars=max_output_chars,
        **extra,
    )
    require_isolation(limits.isolation)

    def run(code: str) -> str:
        result = run_python(code, limits)
        return result.text() or "(no output)"

    return Tool(
        "python",
        "Run a Python program in a sandbox (no network, limited time and memory) and return what it prints.",
        {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        run,
    )


BUILTIN_TOOLS: dict[str, Callable[..., Tool]] = {"calculator": calculator, "python": python_tool}
"""Built-in tool factories by name; options come from `tool_kwargs.<name>`."""


def import_callable(spec: str, key: str) -> Callable[..., Any]:
    """The callable named by 'module.path:attr' (config key `key`), with an error naming the key and the fix."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{key}={spec!r}: give a function as module.path:name.")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure gets the same fix
        raise ValueError(
            f"{key}={spec!r}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}). Put "
            "its folder on PYTHONPATH or run from it, and check the spelling."
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{key}={spec!r}: module {module_name!r} has no attribute {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{key}={spec!r} is a {type(obj).__name__}, not a function.")
    return obj


def build_tools(names: Sequence[str], kwargs: dict[str, dict] | None = None) -> list[Tool]:
    """Built-in tools by name, or user tools given as 'module.path:factory' (a function returning a Tool)."""
    kwargs = kwargs or {}
    unknown_opts = sorted(set(kwargs) - set(names))
    if unknown_opts:
        raise ValueError(f"tool_kwargs names {unknown_opts}, which are not in tools={list(names)}.")
    tools = []
    for name in names:
        if name in BUILTIN_TOOLS:
            factory = BUILTIN_TOOLS[name]
        elif ":" in name:
            factory = import_callable(name, "tools")
        else:
            close = difflib.get_close_matches(name, BUILTIN_TOOLS, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ValueError(
                f"unknown tool {name!r}: the built-in tools are {sorted(BUILTIN_TOOLS)}, a user tool is "
                f"'module.path:factory' returning lmrl.rollout.tools.toolbox.Tool.{hint}"
            )
        try:
            tool = factory(**kwargs.get(name, {}))
        except TypeError as exc:
            raise ValueError(f"bad tool_kwargs.{name}: {exc}") from None
        if not isinstance(tool, Tool):
            raise ValueError(f"tool {name!r}: the factory returned {type(tool).__name__}, expected a Tool.")
        tools.append(tool)
    return tools
