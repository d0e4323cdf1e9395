"""Code: write a small Python function; it is verified by running unit tests in the sandbox (`lmrl.sandbox`).

The problems are small families with random constants and one worked example in the prompt (add k, multiply by k, count a character, sum the
multiples of k, reverse every k-th ...), each with a reference solution (the SFT target) and `n_tests`
assert statements on random inputs. `score` is 1.0 when every test passes; the `code` reward also offers
the pass fraction.
"""

from __future__ import annotations

import dataclasses
import random

from lmrl.data.tasks.base import MAX_COMPLETION_CHARS, Example, Task
from lmrl.sandbox import SandboxLimits, extract_code, run_tests

# (prompt, reference body, reference function for the expected values, input kind); {k} and {c} are constants
_FAMILIES = (
    ("returns x plus {k}", "return x + {k}", lambda k, c: lambda x: x + k, "int"),
    ("returns x times {k}", "return x * {k}", lambda k, c: lambda x: x * k, "int"),
    (
        "returns the number of times '{c}' occurs in the string x",
        "return x.count('{c}')",
        lambda k, c: lambda x: x.count(c),
        "str",
    ),
    (
        "returns the sum of the numbers in the list x that are multiples of {k}",
        "return sum(v for v in x if v % {k} == 0)",
        lambda k, c: lambda x: sum(v for v in x if v % k == 0),
        "list",
    ),
    ("returns the string x repeated {k} times", "return x * {k}", lambda k, c: lambda x: x * k, "str"),
    (
        "returns the largest number in the list x plus {k}",
        "return max(x) + {k}",
        lambda k, c: lambda x: max(x) + k,
        "list",
    ),
)
TEST_LIMITS = SandboxLimits(timeout_s=5, cpu_s=5, memory_mb=256, max_output_chars=2000)


def _input(kind: str, rng: random.Random):
    if kind == "int":
        return rng.randint(-50, 50)
    if kind == "str":
        return "".join(rng.choice("abcab") for _ in range(rng.randint(1, 8)))
    return [rng.randint(-20, 20) for _ in range(rng.randint(1, 6))]


@dataclasses.dataclass
class Code(Task):
    """Write `def f(x):` for a one-line spec; `n_tests` asserts on random inputs check it."""

    name = "code"
    n_tests: int = 4
    """assert statements per problem"""

    def __post_init__(self) -> None:
        if not 1 <= self.n_tests <= 20:
            raise ValueError(f"code: n_tests must be in 1..20, got {self.n_tests}.")

    def sample(self, rng: random.Random) -> Example:
        spec, body, ref, kind = rng.choice(_FAMILIES)
        k, c = rng.randint(2, 30), rng.choice("abc")
        fn = ref(k, c)
        inputs = [_input(kind, rng) for _ in range(self.n_tests)]
        tests = [f"assert f({x!r}) == {fn(x)!r}" for x in inputs]
        example = _input(kind, rng)
        prompt = (
            f"Write a Python function f(x) that {spec.format(k=k, c=c)}. Example: f({example!r}) == {fn(example)!r}."
        )
        solution = f"def f(x):\n    {body.format(k=k, c=c)}\n"
        return Example(self.name, prompt, solution, {"tests": tests})

    def completion(self, example: Example) -> str:
        return f"```python\n{example.answer}```"

    def parse(self, completion: str) -> str | None:
        code = extract_code(completion)
        return code if code.strip() else None

    def score(self, completion: str, answer: str, meta: dict) -> float:
        """1.0 if the completion's code passes every test of `meta["tests"]` in the sandbox, else 0.0."""
        if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
            return 0.0
        code = self.parse(completion)
        tests = list((meta or {}).get("tests") or [])
        if code is None or not tests or "def f" not in code:  # no function f: nothing to run
            return 0.0
        passed, total, _ = run_tests(code, tests, TEST_LIMITS)
        return 1.0 if passed == total else 0.0
