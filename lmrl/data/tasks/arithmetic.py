"""Arithmetic: integer expressions like `12+34=` answered with their value `46`.

`style="chat"` asks the same problems as questions an instruct model answers, `What is 12+34? Answer with the number
only.`, and takes the last number of the reply as its answer (`12 + 34 = 46.` counts). The style travels in the row's
`meta`, so any peer re-scores a chat row the chat way.
"""

from __future__ import annotations

import dataclasses
import random
import re

from lmrl.data.tasks.base import Example, Task, extract_answer, parse_int
from lmrl.data.tasks.expr import evaluate

_MAX_TRIES = 10_000

CHAT_QUESTION = "What is {expression}? Answer with the number only."
"""The prompt of style="chat" (a plain string: the chat template makes it a user turn)."""

STYLES = ("plain", "chat")

_NUMBER = re.compile(r"(?<![\d.])-?\d+(?:\.\d+)?")  # a '-' right after a digit is a minus, not a sign
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def last_number(text: str) -> str | None:
    """The last number in `text` as a normalised integer string ("1,024." -> "1024", "46.0" -> "46"); a last number
    with a fractional part is returned as written; None without a number."""
    numbers = _NUMBER.findall(_THOUSANDS.sub("", text))
    if not numbers:
        return None
    value = float(numbers[-1]) if "." in numbers[-1] else int(numbers[-1])
    return str(int(value)) if value == int(value) else numbers[-1]


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
    style: str = "plain"
    """plain: `12+34=` answered exactly `46`; chat: `What is 12+34? Answer with the number only.`, scored on the last
    number of the reply (for instruct models)"""

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 12:
            raise ValueError(f"arithmetic: digits must be in 1..12, got {self.digits}.")
        if not self.ops or any(c not in "+-*/" for c in self.ops):
            raise ValueError(f"arithmetic: ops must be a non-empty subset of '+-*/', got {self.ops!r}.")
        if not 2 <= self.n_operands <= 8:
            raise ValueError(f"arithmetic: n_operands must be in 2..8, got {self.n_operands}.")
        if self.style not in STYLES:
            raise ValueError(f"arithmetic: style must be one of {STYLES}, got {self.style!r}.")

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
            if self.style == "chat":
                return Example(
                    self.name, CHAT_QUESTION.format(expression=expr), str(value), {"expression": expr, "style": "chat"}
                )
            return Example(self.name, expr + "=", str(value), {"expression": expr})
        raise ValueError(f"arithmetic: no valid problem in {_MAX_TRIES} draws with {self.params()}.")

    def parse(self, completion: str) -> str | None:
        value = parse_int(extract_answer(completion))
        return None if value is None else str(value)

    def parse_answer(self, completion: str, meta: dict) -> str | None:
        """Plain rows: exactly an integer (`parse`); chat rows: the last number of the reply's answer part."""
        if meta.get("style") == "chat":
            return last_number(extract_answer(completion))
        return self.parse(completion)
