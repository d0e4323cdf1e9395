"""The Task contract, answer extraction and train/test row generation shared by all task families.

A task family generates problems with a ground-truth answer and owns their
verifier (nanochat's "tasks own their reward"): `score` depends only on the
completion, the answer and the JSON-serialisable `meta` of the row, never on
the task's generation parameters, so any peer can re-score a row with
`get_task(row["task"]).score(completion, row["answer"], row["meta"])`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from typing import Any, ClassVar

TEST_FRACTION = 0.1
"""Fraction of each task's problem space that belongs to the test split (by prompt hash)."""

MAX_COMPLETION_CHARS = 2000
"""Completions longer than this are scored 0 without parsing (bounds the verifier's cost)."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One generated problem: its prompt, ground-truth answer and what the verifier needs."""

    task: str
    prompt: str
    answer: str
    meta: dict


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def extract_answer(completion: str) -> str:
    """The answer part of a completion: the last `<answer>...</answer>`, else the last
    `\\boxed{...}`, else the whole completion; stripped of surrounding whitespace."""
    tags = _ANSWER_TAG.findall(completion)
    if tags:
        return tags[-1].strip()
    boxed = _BOXED.findall(completion)
    if boxed:
        return boxed[-1].strip()
    return completion.strip()


_INT = re.compile(r"[+-]?\d{1,60}")


def parse_int(text: str) -> int | None:
    """The integer that `text` is exactly (surrounding whitespace allowed), else None."""
    text = text.strip()
    return int(text) if _INT.fullmatch(text) else None


class Task:
    """Base of task families: subclasses are dataclasses whose fields are the generation parameters.

    Subclasses set `name` and implement `sample`, `parse` and `is_correct`;
    `completion` defaults to the answer and `score` wraps parse_answer (by default
    parse) + is_correct so that it never raises.
    """

    name: ClassVar[str] = ""

    def sample(self, rng: random.Random) -> Example:
        """Draw one problem using only `rng` (deterministic for a seeded rng)."""
        raise NotImplementedError

    def completion(self, example: Example) -> str:
        """The canonical SFT target for `example` (short, e.g. arithmetic "46")."""
        return example.answer

    def parse(self, completion: str) -> str | None:
        """The normalised answer extracted from a completion, or None if there is none."""
        raise NotImplementedError

    def parse_answer(self, completion: str, meta: dict) -> str | None:
        """The normalised answer of a completion to the row with `meta` (default: `parse`; a task whose rows ask
        for different answer formats, like arithmetic's chat style, reads `meta`)."""
        return self.parse(completion)

    def messages(self, example: Example) -> list[dict] | None:
        """A multi-turn SFT trace (e.g. tool use, OpenAI message format) for `example`; None (default): none."""
        return None

    def is_correct(self, parsed: str, answer: str, meta: dict) -> bool:
        """Whether a parsed answer solves the problem (default: equals the parsed ground truth)."""
        return parsed == self.parse(answer)

    def score(self, completion: str, answer: str, meta: dict) -> float:
        """1.0 if the completion solves the problem, else 0.0; never raises."""
        try:
            if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
                return 0.0
            meta = dict(meta or {})
            parsed = self.parse_answer(completion, meta)
            if parsed is None:
                return 0.0
            return 1.0 if self.is_correct(parsed, answer, meta) else 0.0
        except Exception:  # a verifier must survive any string a policy can emit
            return 0.0

    def params(self) -> dict[str, Any]:
        """The generation parameters of this task instance."""
        return dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}


def split_of(prompt: str) -> str:
    """ "test" for a stable TEST_FRACTION of prompts (by SHA-256 of the prompt), else "train"."""
    h = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big")
    return "test" if h % 10_000 < TEST_FRACTION * 10_000 else "train"


def _row(task: Task, ex: Example) -> dict:
    row = {
        "task": task.name,
        "prompt": ex.prompt,
        "completion": task.completion(ex),
        "answer": ex.answer,
        "meta": ex.meta,
    }
    messages = task.messages(ex)
    if messages is not None:  # a multi-turn (tool-use) trace for SFT
        row["messages"] = messages
    return row


def make_rows(task: Task, n: int, split: str = "train", seed: int = 0, allow_fewer: bool = False) -> list[dict]:
    """`n` rows (prompt, completion, answer, task, meta) of `split`, deterministic for `seed`.

    Problems are drawn from `task` and kept when `split_of(prompt) == split`, so
    the test split never contains a train prompt, whatever the seeds. Rows are
    unique while the problem space allows; after 20·n + 1000 draws train rows may
    repeat, while a test split that cannot reach n unique problems is an error
    (or, with `allow_fewer`, returns the unique test problems found).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}.")
    rng = random.Random(f"lmrl:{task.name}:{split}:{seed}")
    rows: list[dict] = []
    seen: set[str] = set()
    budget = 20 * n + 1000
    draws = 0
    while len(rows) < n and draws < budget:
        draws += 1
        ex = task.sample(rng)
        if ex.prompt not in seen and split_of(ex.prompt) == split:
            seen.add(ex.prompt)
            rows.append(_row(task, ex))
    if len(rows) < n and split == "test" and rows and allow_fewer:
        return rows
    if len(rows) < n and (split == "test" or not rows):
        raise ValueError(
            f"task {task.name!r} with parameters {task.params()} produced only {len(rows)} unique "
            f"{split} problems in {draws} draws, fewer than the {n} asked for. Ask for fewer rows "
            "or widen the problem space (e.g. more digits, longer lists, larger numbers)."
        )
    while len(rows) < n:  # small problem space: train rows repeat
        ex = task.sample(rng)
        if split_of(ex.prompt) == split:
            rows.append(_row(task, ex))
    return rows
