"""Countdown: reach a target with + - * / over given numbers, e.g. `make 22 from 3 5 7` -> `3*5+7`."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

from lmrl.data.tasks.base import Example, Task, extract_answer
from lmrl.data.tasks.expr import evaluate, render, tree_value

_MAX_TRIES = 10_000


@dataclasses.dataclass
class Countdown(Task):
    """Countdown numbers game (as in TinyZero): write an expression equal to the target.

    The verifier accepts any expression that uses only + - * / and parentheses
    over the given numbers, each at most as often as given, and evaluates exactly
    (fractions) to the target. Targets are built from a random expression over
    all the numbers, with only exact divisions, so every problem is solvable.
    """

    name = "countdown"
    n_numbers: int = 3
    """numbers given per problem (>= 2)"""
    max_number: int = 20
    """numbers are uniform in [1, max_number]"""
    max_target: int = 100
    """targets are in [1, max_target]"""
    ops: str = "+-*/"
    """operators used to build targets (the verifier accepts all four)"""

    def __post_init__(self) -> None:
        if not 2 <= self.n_numbers <= 6:
            raise ValueError(f"countdown: n_numbers must be in 2..6, got {self.n_numbers}.")
        if self.max_number < 1 or self.max_target < 1:
            raise ValueError("countdown: max_number and max_target must be >= 1.")
        if not self.ops or any(c not in "+-*/" for c in self.ops):
            raise ValueError(f"countdown: ops must be a non-empty subset of '+-*/', got {self.ops!r}.")

    def _tree(self, rng: random.Random, nums: list[int]) -> int | tuple:
        if len(nums) == 1:
            return nums[0]
        k = rng.randint(1, len(nums) - 1)
        return (rng.choice(self.ops), self._tree(rng, nums[:k]), self._tree(rng, nums[k:]))

    def sample(self, rng: random.Random) -> Example:
        for _ in range(_MAX_TRIES):
            nums = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            tree = self._tree(rng, rng.sample(nums, len(nums)))
            value = tree_value(tree)
            if value is None or value.denominator != 1 or not 1 <= value <= self.max_target:
                continue
            if not _exact_divisions(tree):
                continue
            nums.sort()
            target = int(value)
            prompt = f"make {target} from " + " ".join(map(str, nums))
            return Example(self.name, prompt, render(tree), {"numbers": nums, "target": target})
        raise ValueError(f"countdown: no valid problem in {_MAX_TRIES} draws with {self.params()}.")

    def parse(self, completion: str) -> str | None:
        text = extract_answer(completion).split("=")[0].strip()  # "3*5+7=22" -> "3*5+7"
        return text if evaluate(text) is not None else None

    def is_correct(self, parsed: str, answer: str, meta: dict) -> bool:
        result = evaluate(parsed)
        if result is None:
            return False
        value, literals = result
        available = Counter(int(x) for x in meta["numbers"])
        return value == int(meta["target"]) and not Counter(literals) - available


def _exact_divisions(tree: int | tuple) -> bool:
    """Whether every division in the tree divides integers exactly (keeps canonical answers simple)."""
    if isinstance(tree, int):
        return True
    op, left, right = tree
    if op == "/":
        a, b = tree_value(left), tree_value(right)
        if a is None or b is None or b == 0 or (a / b).denominator != 1:
            return False
    return _exact_divisions(left) and _exact_divisions(right)
