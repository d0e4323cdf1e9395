"""Decontamination: n-gram overlap between training data and evaluation sets (RLHF book §16, spec §8).

A text is lower-cased and split into word tokens (runs of letters/digits, and each other non-space character
on its own, so ``12+34=`` is 4 tokens: ``12 + 34 =``). Its n-grams are the windows of n consecutive tokens; a
text shorter than n tokens has one gram, itself (so short prompts are compared whole). An evaluation row is
contaminated when the share of its n-grams also found in the training data is at least ``threshold``
(Tulu 3 uses 8-grams; ``threshold=0.5`` flags a row whose grams are mostly seen in training).

    report = overlap(train_rows, eval_rows, n=8)
    report.contaminated          # indices of contaminated eval rows
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_TOKEN = re.compile(r"[^\W_]+|[^\w\s]|_", re.UNICODE)

TEXT_COLUMNS = ("prompt", "question", "completion", "messages", "chosen", "rejected", "text", "choices", "context")
"""Training-row columns whose strings are compared (nested message lists included); answers and metadata are not."""

EVAL_COLUMNS = ("prompt", "question", "messages", "text", "context")
"""Evaluation-row columns compared: what the model is asked (short gold answers such as "46" would match any
training row with the same answer)."""

ASKED_ROLES = ("system", "user")
"""Roles of an evaluation row's messages that are compared: the question, not the assistant's replies or tool
outputs (a tool task's reference trace holds the gold answer, e.g. the calculator's ``1360``)."""


def tokens(text: str) -> list[str]:
    """Lower-cased word and symbol tokens of ``text``."""
    return _TOKEN.findall(text.lower())


def ngrams(text: str, n: int = 8) -> set[tuple[str, ...]]:
    """The n-grams of ``text``'s tokens; a text of fewer than n tokens (but at least one) is its own single gram."""
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}.")
    toks = tokens(text)
    if not toks:
        return set()
    if len(toks) < n:
        return {tuple(toks)}
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def row_texts(row: Any, columns: Sequence[str] = TEXT_COLUMNS, roles: Sequence[str] | None = None) -> list[str]:
    """The strings of a row's text columns (recursing into messages and lists); a plain string is itself.
    ``roles``: only messages of these roles are read (None: every message)."""
    if isinstance(row, str):
        return [row]
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, Mapping):
            if roles is None or value.get("role") in roles:
                walk(value.get("content"))
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for column in columns:
        if isinstance(row, Mapping) and column in row:
            walk(row[column])
    return out


@dataclass
class OverlapReport:
    n: int
    threshold: float
    eval_rows: int
    contaminated: list[int] = field(default_factory=list)
    """indices of eval rows whose overlap share >= threshold"""
    shares: list[float] = field(default_factory=list)
    """per eval row: share of its n-grams seen in the training data"""

    @property
    def fraction(self) -> float:
        return len(self.contaminated) / self.eval_rows if self.eval_rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "threshold": self.threshold,
            "eval_rows": self.eval_rows,
            "contaminated_rows": len(self.contaminated),
            "contaminated_frac": self.fraction,
            "contaminated_indices": self.contaminated,
        }


def overlap(train: Iterable[Any], evals: Sequence[Any], n: int = 8, threshold: float = 0.5) -> OverlapReport:
    """Which ``evals`` rows share at least ``threshold`` of their n-grams with the ``train`` rows (rows: dicts
    with text columns, or strings). Training rows contribute every `TEXT_COLUMNS` string, eval rows their
    `EVAL_COLUMNS`, messages of the `ASKED_ROLES` only (the question, not the gold answer)."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}.")
    seen: set[tuple[str, ...]] = set()
    for row in train:
        for text in row_texts(row):
            seen |= ngrams(text, n)
    report = OverlapReport(n, threshold, len(evals))
    for i, row in enumerate(evals):
        grams = set().union(*(ngrams(t, n) for t in row_texts(row, EVAL_COLUMNS, ASKED_ROLES)))
        share = len(grams & seen) / len(grams) if grams else 0.0
        report.shares.append(share)
        if grams and share >= threshold:
            report.contaminated.append(i)
    return report
