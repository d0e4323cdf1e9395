"""Exact evaluation of untrusted arithmetic expressions, with `ast` and a whitelist (never `eval`)."""

from __future__ import annotations

import ast
import re
from fractions import Fraction

MAX_EXPR_CHARS = 200
"""Longer expressions are rejected before parsing (bounds parse depth and cost)."""

_CHARS = re.compile(r"[0-9+\-*/() ]*")

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def evaluate(expr: str, ops: str = "+-*/") -> tuple[Fraction, list[int]] | None:
    """(exact value, integer literals in order) of `expr`, or None if it is not allowed.

    Allowed: decimal integer literals, binary operators among `ops`
    (+ - * /, true division evaluated with fractions) and parentheses. Anything
    else (names, calls, attributes, unary minus, floats, `**`, ...) and division
    by zero give None.
    """
    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS or not _CHARS.fullmatch(expr.strip()):
        return None  # only digits, spaces, + - * / and parentheses can reach the parser
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    literals: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS and _OPS[type(node.op)] in ops:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise ZeroDivisionError
            return left / right
        raise ValueError(f"disallowed syntax {type(node).__name__}")

    try:
        return walk(tree.body), literals
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def render(tree: int | tuple, parent_op: str | None = None, right_side: bool = False) -> str:
    """Infix text of an expression tree (int leaves, (op, left, right) nodes) with minimal parentheses.

    A child is parenthesised when its operator binds weaker than its parent's, or
    equally on the right of a non-associative parent (`-`, `/`): a-(b-c), a/(b*c).
    """
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    text = f"{render(left, op, False)}{op}{render(right, op, True)}"
    if parent_op is not None and (
        PRECEDENCE[op] < PRECEDENCE[parent_op]
        or (right_side and PRECEDENCE[op] == PRECEDENCE[parent_op] and parent_op in "-/")
    ):
        return f"({text})"
    return text


def tree_value(tree: int | tuple) -> Fraction | None:
    """Exact value of an expression tree, None on division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = tree_value(left), tree_value(right)
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b
