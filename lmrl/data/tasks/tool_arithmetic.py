"""Tool arithmetic: multiply two large integers, e.g. `4821*9375=`; a calculator makes it easy, a tiny model alone cannot.

Rows carry a tool-use trace in `messages` (OpenAI format: the assistant calls `calculator` with the expression,
the tool answers, the assistant repeats the value) for an SFT warm start; the final answer is the bare integer.
With tools=False the rows are plain prompt/completion pairs (the same problems, answered directly): the
no-tool baseline.
"""

from __future__ import annotations

import dataclasses
import random

from lmrl.data.tasks.base import Example, Task, extract_answer, parse_int


@dataclasses.dataclass
class ToolArithmetic(Task):
    """`a*b=` with `digits`-digit a and b (leading digit non-zero); the answer is the exact product."""

    name = "tool_arithmetic"
    digits: int = 4
    """digits of each operand"""
    tools: bool = True
    """rows carry a calculator trace in `messages` (False: prompt/completion only)"""

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise ValueError(f"tool_arithmetic: digits must be in 1..9, got {self.digits}.")

    def sample(self, rng: random.Random) -> Example:
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return Example(self.name, f"{a}*{b}=", str(a * b), {"expression": f"{a}*{b}"})

    def parse(self, completion: str) -> str | None:
        value = parse_int(extract_answer(completion))
        return None if value is None else str(value)

    def messages(self, example: Example) -> list[dict] | None:
        """The tool-use trace of `example` (None with tools=False)."""
        if not self.tools:
            return None
        call = {
            "type": "function",
            "id": "call_1",
            "function": {"name": "calculator", "arguments": {"expression": example.meta["expression"]}},
        }
        return [
            {"role": "user", "content": example.prompt},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": example.answer, "tool_call_id": "call_1"},
            {"role": "assistant", "content": example.answer},
        ]
