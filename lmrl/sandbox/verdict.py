"""The code verifier's judge: tests are evaluated here, outside the sandbox, from values the sandbox returns.

A test such as `assert f(2) == 4` is split: the calls into the candidate's code (`f(2)`) are sent to the sandbox,
which returns each value as a `repr`; the assertion (`... == 4`) is evaluated in this process on those values,
parsed with `ast.literal_eval`. The sandboxed process never sees an expected value and has no channel that can
say "passed": the most it can do is return values, which is what a solution does. So fake counts, replaced
builtins, early exits, objects whose `__eq__` always says True and secrets read from /proc all pass nothing.

Expected values that are not literals (issue 46): `assert f(3) == math.factorial(3)`, or `== EXPECTED` with
`EXPECTED` bound by the tests' `setup`, are *reference* expressions. They are computed in a second sandboxed
process that runs the setup and never loads the candidate's code (`Reference` nodes), so patching `math.factorial`
or defining `EXPECTED` in the candidate changes nothing, and a correct answer that does not `import math` passes.
A reference expression is one rooted at a name the `setup` binds, or at a standard-library module used as
`module.attr` (`math.factorial(3)`, `string.ascii_lowercase`); a candidate's value inside one
(`statistics.mean(f(3))`) is computed in the candidate's process and handed over as a literal. Every other name is
the candidate's (its functions and constants are what is tested); builtins outside `SAFE_FUNCTIONS` are evaluated
with the candidate's code loaded, so write expected values as literals, module calls or setup names.

Supported tests: one `assert` whose expression uses literals, the candidate's names and calls, comparisons,
`and`/`or`/`not`, arithmetic (bounded), subscripts and a few pure builtins (`SAFE_FUNCTIONS`). Anything else
(comprehensions, lambdas, several statements) is refused with a ValueError naming the test.
"""

from __future__ import annotations

import ast
import builtins
import math
import operator
import sys
from typing import Any

from lmrl.sandbox.operators import BINARY

SAFE_FUNCTIONS = {
    "abs": abs,
    "len": len,
    "min": min,
    "max": max,
    "sum": sum,
    "sorted": sorted,
    "round": round,
    "set": set,
    "frozenset": frozenset,
    "list": list,
    "tuple": tuple,
    "dict": dict,
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "all": all,
    "any": any,
    "isinstance": isinstance,
    "math.isclose": math.isclose,
}
TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "list": list,
    "tuple": tuple,
    "dict": dict,
    "set": set,
    "bytes": bytes,
    "type(None)": type(None),
}
MAX_VALUE_CHARS = 100_000
"""a returned value's repr longer than this fails its tests (bounds the work done on it here)"""
MAX_SIZE = 1_000_000
"""largest sequence or integer (in digits) an operation of a test may build here"""
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
MISSING = object()
"""a call whose value did not come back (it raised, the process died or timed out, or the value is not data)"""


class Remote(ast.expr):
    """A subexpression evaluated in the sandbox: `index` into the list of calls sent there."""

    _fields = ("index",)


class Reference(ast.expr):
    """An expected value computed in a sandbox that never loads the candidate: `index` into `Split.refs`."""

    _fields = ("index",)


VALUE_NAME = "_lmrl_value_{}"
"""in a reference expression, the name that holds the candidate's value of call `i` (a literal, set before it)"""
MODULES = frozenset(sys.stdlib_module_names) - {"this", "antigravity", "__future__"}
"""modules a reference expression may use as `module.attr` (the reference process imports them itself)"""


def setup_names(setup: str) -> frozenset[str]:
    """The names the tests' setup binds at its top level (assignments, imports, defs, classes)."""
    try:
        tree = ast.parse(setup or "")
    except SyntaxError as exc:
        raise ValueError(f"the tests' setup is not valid Python: {exc.msg} (line {exc.lineno}).") from None
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


def _root(node: ast.AST) -> ast.Name | None:
    """The name an attribute / call / subscript chain starts from (`math` of `math.gcd(4, 6).real`)."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node if isinstance(node, ast.Name) else None


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


class _Split(ast.NodeTransformer):
    """Replaces every call into the candidate's code (and every other name) by a Remote node, and every expected
    value that is not a literal (a setup name, `module.attr`) by a Reference node."""

    def __init__(self, calls: list[str], refs: list[tuple[str, tuple[int, ...]]] | None, setup: frozenset[str]):
        self.calls, self.refs, self.setup = calls, refs, setup

    def _remote(self, node: ast.AST) -> Remote:
        if self.refs is not None:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and sub.id in self.setup:
                    raise ValueError(
                        f"the setup name {sub.id!r} inside a call to the candidate's code (the candidate never sees "
                        "the setup); pass the input as a literal"
                    )
        source = ast.unparse(node)
        if source not in self.calls:
            self.calls.append(source)
        return ast.copy_location(Remote(self.calls.index(source)), node)

    def _is_reference(self, node: ast.AST) -> bool:
        root = _root(node)
        if self.refs is None or root is None:
            return False
        return root.id in self.setup or (root is not node and root.id in MODULES)

    def _reference(self, node: ast.AST) -> Reference:
        """The expression, evaluated in the reference process; the candidate's values in it become literals."""
        deps: list[int] = []
        split = self

        class Values(ast.NodeTransformer):
            def visit(self, sub: ast.AST) -> ast.AST:
                root = _root(sub)
                if root is not None and not (
                    root.id in split.setup or root.id in MODULES or hasattr(builtins, root.id) or root.id in TYPES
                ):
                    index = split._remote(sub).index
                    deps.append(index)
                    return ast.copy_location(ast.Name(VALUE_NAME.format(index), ast.Load()), sub)
                return super().visit(sub)

        source = ast.unparse(Values().visit(node))
        entry = (source, tuple(sorted(set(deps))))
        if entry not in self.refs:
            self.refs.append(entry)
        return ast.copy_location(Reference(self.refs.index(entry)), node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if _name(node.func) in SAFE_FUNCTIONS and not any(isinstance(a, ast.Starred) for a in node.args):
            node.args = [self.visit(a) for a in node.args]
            node.keywords = [ast.keyword(k.arg, self.visit(k.value)) for k in node.keywords if k.arg is not None]
            return node
        return self._reference(node) if self._is_reference(node) else self._remote(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in TYPES:
            return node
        return self._reference(node) if self._is_reference(node) else self._remote(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return self._reference(node) if self._is_reference(node) else self._remote(node)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        allowed = (
            ast.Constant,
            ast.Tuple,
            ast.List,
            ast.Set,
            ast.Dict,
            ast.UnaryOp,
            ast.BinOp,
            ast.BoolOp,
            ast.Compare,
            ast.Subscript,
            ast.Slice,
            ast.Call,
            ast.keyword,
            ast.Load,
            ast.operator,
            ast.unaryop,
            ast.boolop,
            ast.cmpop,
            Remote,
            Reference,
        )
        if not isinstance(node, allowed) or isinstance(node, ast.operator) and type(node) not in BINARY:
            raise ValueError(f"{type(node).__name__}")
        return super().generic_visit(node)


def split_test(
    test: str,
    calls: list[str],
    refs: list[tuple[str, tuple[int, ...]]] | None = None,
    setup: frozenset[str] = frozenset(),
) -> ast.expr:
    """The assertion of `test` with its calls into the candidate replaced by Remote(i) (`calls` gets their
    source) and, when `refs` is a list, its non-literal expected values by Reference(j) (`refs` gets
    (source, indices of the candidate's values it uses)); `setup`: the names the tests' setup binds."""
    try:
        body = ast.parse(test).body
    except SyntaxError as exc:
        raise ValueError(f"test {test!r} is not valid Python: {exc.msg}.") from None
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        raise ValueError(f"test {test!r} must be one assert statement, e.g. 'assert f(2) == 4'.")
    try:
        return _Split(calls, refs, setup).visit(body[0].test)
    except ValueError as exc:
        raise ValueError(
            f"test {test!r} uses {exc}, which the code verifier does not evaluate: write it as an "
            "assert on calls, literals, comparisons, arithmetic and simple builtins "
            f"({', '.join(sorted(SAFE_FUNCTIONS))})."
        ) from None


def parse_values(text: str, n: int) -> list[Any]:
    """Values of the `n` calls from the sandbox's `index<TAB>repr` lines (the first line per index counts)."""
    values: list[Any] = [MISSING] * n
    for line in text.splitlines():
        index, _, rep = line.partition("\t")
        if not index.isdigit() or int(index) >= n or values[int(index)] is not MISSING:
            continue
        if rep.startswith("!") or len(rep) > MAX_VALUE_CHARS:
            continue
        try:
            values[int(index)] = ast.literal_eval(rep)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    return values


def passes(assertion: ast.expr, values: list[Any], references: list[Any] = ()) -> bool:
    """Whether the assertion holds on the returned values (the candidate's, and the reference process's);
    any error or missing value fails it."""
    try:
        return bool(_eval(assertion, values, references))
    except Exception:  # noqa: BLE001 - a test that cannot be evaluated on these values fails
        return False


def reference_program(setup: str, refs: list[tuple[str, tuple[int, ...]]], values: list[Any]) -> str:
    """The reference process's code: the setup, the candidate's values it needs as literals (a missing one stays
    undefined, so the expressions using it fail), and the modules the expressions use, imported."""
    lines = [setup or ""]
    for index in sorted({i for _, deps in refs for i in deps}):
        if values[index] is not MISSING:
            lines.append(f"{VALUE_NAME.format(index)} = {values[index]!r}")
    used = {n.id for source, _ in refs for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    lines += [f"import {m}" for m in sorted(used & MODULES - setup_names(setup))]
    return "\n".join(lines) + "\n"


def _eval(node: ast.AST, values: list[Any], references: list[Any] = ()) -> Any:
    ev = lambda n: _eval(n, values, references)  # noqa: E731
    if isinstance(node, (Remote, Reference)):
        value = (values if isinstance(node, Remote) else references)[node.index]
        if value is MISSING:
            raise LookupError("no value")
        return value
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return TYPES[node.id]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [ev(e) for e in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        return {ev(k): ev(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp):
        value = ev(node.operand)
        return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}[
            type(node.op)
        ](value)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(ev(v) for v in node.values)
        return any(ev(v) for v in node.values)
    if isinstance(node, ast.Compare):
        left = ev(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = ev(right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BinOp):
        return _binary(node.op, ev(node.left), ev(node.right))
    if isinstance(node, ast.Subscript):
        return ev(node.value)[ev(node.slice)]
    if isinstance(node, ast.Slice):
        return slice(*(ev(p) if p is not None else None for p in (node.lower, node.upper, node.step)))
    if isinstance(node, ast.Call):
        fn = SAFE_FUNCTIONS[_name(node.func)]
        return fn(*[ev(a) for a in node.args], **{k.arg: ev(k.value) for k in node.keywords})
    raise ValueError(f"cannot evaluate {type(node).__name__}")


def _binary(op: ast.operator, left: Any, right: Any) -> Any:
    """Arithmetic whose result is bounded: a huge power or repetition is an error, not a hung trainer."""
    if isinstance(op, ast.Pow) and isinstance(right, int) and isinstance(left, int) and abs(left) > 1:
        if abs(right) * left.bit_length() > MAX_SIZE:
            raise OverflowError("power too large")
    if isinstance(op, ast.Mult):
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_SIZE:
            raise OverflowError("repetition too large")
    return BINARY[type(op)](left, right)
