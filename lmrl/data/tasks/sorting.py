"""Sorting: `sort 5 3 9 1` -> `1 3 5 9`."""

from __future__ import annotations

import dataclasses
import random
import re

from lmrl.data.tasks.base import Example, Task, extract_answer

_SEP = re.compile(r"[\s,]+")


@dataclasses.dataclass
class Sorting(Task):
    """Sort a list of non-negative integers; the answer is the sorted list separated by spaces.

    Prompts read `sort 5 3 9 1` (ascending) or `sort desc 5 3 9 1` (descending).
    The verifier accepts spaces or commas as separators and optional brackets.
    """

    name = "sorting"
    length: int = 5
    """numbers per list (>= 2)"""
    max_value: int = 99
    """numbers are uniform in [0, max_value]"""
    descending: bool | None = False
    """False: ascending, True: descending, None: each problem picks one at random"""

    def __post_init__(self) -> None:
        if not 2 <= self.length <= 50:
            raise ValueError(f"sorting: length must be in 2..50, got {self.length}.")
        if self.max_value < 1:
            raise ValueError(f"sorting: max_value must be >= 1, got {self.max_value}.")

    def sample(self, rng: random.Random) -> Example:
        nums = [rng.randint(0, self.max_value) for _ in range(self.length)]
        desc = rng.random() < 0.5 if self.descending is None else bool(self.descending)
        prompt = ("sort desc " if desc else "sort ") + " ".join(map(str, nums))
        answer = " ".join(map(str, sorted(nums, reverse=desc)))
        return Example(self.name, prompt, answer, {"numbers": nums, "descending": desc})

    def parse(self, completion: str) -> str | None:
        text = extract_answer(completion).strip().strip("[]()").strip()
        parts = [p for p in _SEP.split(text) if p]
        if not parts or not all(p.isdigit() and len(p) <= 30 and p.isascii() for p in parts):
            return None
        return " ".join(str(int(p)) for p in parts)
