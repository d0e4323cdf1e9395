"""How an evaluation row's completion is judged correct: by its built-in task, or by a verifier on `answer`.

    verifier=auto   a row with a `task` column is scored by that task (`get_task(row.task).score`), other rows
                    by exact match of the extracted answer (`<answer>..</answer>`, `\\boxed{}`, else the text)
    verifier=exact  exact match of the extracted answer with `answer` (whitespace stripped)
    verifier=math   math-verify equivalence of the boxed/last-number answer with `answer`

Every verifier returns (parsed answer, score in [0, 1]); the parsed answer is what maj@k votes on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lmrl.data.tasks import extract_answer, get_task

VERIFIERS = ("auto", "exact", "math", "task")

Scorer = Callable[[str, dict[str, Any]], tuple[Any, float]]


def check_rows(rows: Sequence[dict[str, Any]], verifier: str, answer_column: str, source: str) -> None:
    """Start-up check that every row has what ``verifier`` needs (the answer column, or a task column)."""
    if verifier not in VERIFIERS:
        raise ValueError(f"'verifier' must be one of {VERIFIERS}, got {verifier!r}.")
    for i, row in enumerate(rows):
        if verifier in ("auto", "task") and "task" in row and "answer" in row:
            continue
        if verifier == "task":
            raise ValueError(
                f"{source}: row {i} has no 'task' column, which verifier=task needs; use "
                "verifier=exact or verifier=math with an answer column."
            )
        if row.get(answer_column) is None:
            raise ValueError(
                f"{source}: row {i} has no '{answer_column}' column (columns: {sorted(row)}), which "
                f"accuracy metrics need. Add the gold answers as '{answer_column}', or name the "
                f"column with answer_column=..., or evaluate with metrics that need none "
                "(reward, win_rate)."
            )


def scorer(verifier: str, answer_column: str = "answer") -> Scorer:
    """A function (completion, row) -> (parsed answer or None, score)."""

    def score(completion: str, row: dict[str, Any]) -> tuple[Any, float]:
        if verifier in ("auto", "task") and "task" in row:
            task, meta = get_task(row["task"]), row.get("meta") or {}
            try:
                parsed = task.parse_answer(completion, dict(meta))
            except Exception:  # a parser must survive any string a model emits
                parsed = None
            return parsed, task.score(completion, row["answer"], meta)
        gold = str(row[answer_column])
        if verifier == "math":
            from lmrl.rewards.math_verifier import extract_answer as math_extract
            from lmrl.rewards.math_verifier import math_score

            return math_extract(completion), math_score(completion, gold)[0]
        parsed = extract_answer(completion)
        return (parsed or None), float(parsed == gold.strip())

    return score
