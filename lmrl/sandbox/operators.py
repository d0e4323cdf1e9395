"""Python's binary arithmetic operators by AST node type, as functions: what the code verifier's judge
(`lmrl.sandbox.verdict`) and the calculator tool (`lmrl.rollout.tools.toolbox.calculate`) apply when they evaluate
untrusted expressions without `eval`. Each evaluator checks sizes its own way before it applies one."""

from __future__ import annotations

import ast
import operator

BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
