"""Arithmetic: integer expressions like `12+34=` answered with their value `46`."""

from __future__ import annotations

import dataclasses
import random

from lmrl.data.tasks.base import Example, Task, extract_answer, parse_int
from lmrl.data.tasks.expr import evaluate

_MAX_TRIES = 10_000


@dataclasses.dataclass
class Arithmetic(Task):
    """`a+b-c=` style problems over integers with up to `digits` digits; the answer is the exact integer value.

    Usual precedence applies (`*`, `/` before `+`, `-`). Division appears only
    where it is exact. With negative=False, problems with a negative value are
    redrawn.
    """

    name = "arithmetic"
    digits: int = 2
    """operands are uniform in [0, 10**digits - 1]"""
    ops: str = "+-"
    """operators to draw from, a subset of "+-*/" """
    n_operands: int = 2
    """operands per expression (>= 2)"""
    negative: bool = True
    """allow negative answers"""

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 12:
            raise ValueError(f"arithmetic: digits must be in 1..12, got {self.digits}.")
        if not self.ops or any(c not in "+-*/" for c in self.ops):
            raise ValueError(f"arithmetic: ops must be a non-empty subset of '+-*/', got {self.ops!r}.")
        if not 2 <= self.n_operands <= 8:
            raise ValueError(f"arithmetic: n_operands must be in 2..8, got {self.n_operands}.")

    def sample(self, rng: random.Random) -> Example:
        hi = 10**self.digits - 1
        for _ in range(_MAX_TRIES):
            ops = [rng.choice(self.ops) for _ in range(self.n_operands - 1)]
            nums = [rng.randint(0, hi) for _ in range(self.n_operands)]
            if self.n_operands == 2 and ops[0] == "/":
                nums[1] = rng.randint(1, hi)  # exact division by construction: a = b*q
                nums[0] = nums[1] * rng.randint(0, hi // nums[1])
            expr = str(nums[0]) + "".join(op + str(x) for op, x in zip(ops, nums[1:]))
            result = evaluate(expr, self.ops)
            if result is None or result[0].denominator != 1:
                continue
            value = int(result[0])
            if value < 0 and not self.negative:
                continue
            return Example(self.name, expr + "=", str(value), {"expression": expr})
        raise ValueError(f"arithmetic: no valid problem in {_MAX_TRIES} draws with {self.params()}.")

    def parse(self, completion: str) -> str | None:
        value = parse_int(extract_answer(completion))
        return None if value is None else str(value)
