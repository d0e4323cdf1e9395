"""Linear equations: `solve 3x+4=19` -> `5`."""

from __future__ import annotations

import dataclasses
import random

from lmrl.data.tasks.base import Example, Task, extract_answer, parse_int


@dataclasses.dataclass
class Linear(Task):
    """Solve a*x + b = c for the integer x, with a in 1..max_coef and |b| <= max_const.

    Rendered without redundant symbols: `x+4=9`, `3x=12`, `2x-5=7`.
    """

    name = "linear"
    max_coef: int = 9
    """a is uniform in [1, max_coef]"""
    max_x: int = 9
    """x is uniform in [-max_x, max_x] (or [0, max_x] with negative=False)"""
    max_const: int = 20
    """b is uniform in [-max_const, max_const]"""
    negative: bool = True
    """allow negative solutions"""

    def __post_init__(self) -> None:
        if self.max_coef < 1 or self.max_x < 1 or self.max_const < 0:
            raise ValueError("linear: need max_coef >= 1, max_x >= 1 and max_const >= 0.")

    def sample(self, rng: random.Random) -> Example:
        a = rng.randint(1, self.max_coef)
        x = rng.randint(-self.max_x if self.negative else 0, self.max_x)
        b = rng.randint(-self.max_const, self.max_const)
        lhs = ("" if a == 1 else str(a)) + "x" + ("" if b == 0 else f"{b:+d}")
        return Example(self.name, f"solve {lhs}={a * x + b}", str(x), {"a": a, "b": b, "c": a * x + b})

    def parse(self, completion: str) -> str | None:
        text = extract_answer(completion)
        if text.replace(" ", "").startswith("x="):  # accept "x=5"
            text = text.replace(" ", "")[2:]
        value = parse_int(text)
        return None if value is None else str(value)
