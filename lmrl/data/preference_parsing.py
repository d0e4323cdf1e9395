"""Preference rows: the accepted formats, validated into `PreferenceGroup`s and `LabelledExample`s.

Row formats (RLHF book ch. 10-11; TRL's column names):
  pairwise     {"prompt", "chosen", "rejected"} (text, or message lists as in TRL's conversational
               format), optional "margin" or "chosen_score"/"rejected_score" (ratings, higher = better);
  messages     {"chosen": [...], "rejected": [...]} full conversations without a prompt column: the
               prompt is every message up to the last user turn and must be the same in both;
  ranked       {"prompt", "completions": [...], "ranking" | "scores"}: "ranking" lists completion
               indices best first (a permutation, no ties), "scores" rates each completion;
  unpaired     {"prompt", "completion", "label"} with a 0/1 or bool label (KTO, outcome RMs);
  stepwise     {"prompt", "completions": [step, ...], "labels": [...]} with -1/0/+1 (or bool) per
               step (process RMs; TRL's stepwise-supervision format).
Every problem raises one ValueError naming the row (1-based) and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from lmrl.data.loading import check_completion, check_prompt, coerce_messages, row_where

Text = str | list  # a completion or prompt: text, or a list of {"role", "content"} messages


@dataclasses.dataclass(frozen=True)
class PreferenceGroup:
    """One prompt with K >= 2 completions ranked best first (K = 2: chosen, rejected)."""

    prompt: Text
    completions: tuple  # best first
    scores: tuple[float, ...] | None  # ratings of the completions (best first), if the row has them
    margin: float | None  # the row's `margin`, else chosen_score − rejected_score (K = 2), else None
    row: dict  # the source row (answer, meta, ... for evaluation)
    where: str

    @property
    def k(self) -> int:
        return len(self.completions)


@dataclasses.dataclass(frozen=True)
class LabelledExample:
    """One prompt/completion with a label: 0/1 outcome (KTO desirability, ORM), or per-step −1/0/+1 (PRM)."""

    prompt: Text
    completion: Text  # PRM: the steps joined with STEP_SEPARATOR
    label: int | tuple[int, ...]
    where: str
    steps: tuple[str, ...] = ()


STEP_SEPARATOR = "\n"
"""Steps of a stepwise completion are joined with this; each step's label sits on its last token."""


def _number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: {what} must be a finite number, got {value!r}. Fix or drop the row.")
    return float(value)


def _completion(value: Any, what: str, where: str) -> Text:
    if value is None:
        raise ValueError(f"{where}: `{what}` is missing (null). Every preference row needs it; drop the row.")
    check_completion(value, f"{where} ({what})")
    return value


def _split_conversation(messages: Any, what: str, where: str) -> tuple[list, list]:
    """(prompt = messages up to the last user turn, completion = the rest) of a full conversation."""
    from lmrl.data.chat import validate_messages

    messages = coerce_messages(messages, where)
    validate_messages(messages, f"{where} ({what})")
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return list(messages[: last_user + 1]), list(messages[last_user + 1 :])


def _messages_pair(row: dict, where: str) -> tuple[list, list, list]:
    """prompt, chosen, rejected of a messages-style row, checking both share the same prompt."""
    p_c, chosen = _split_conversation(row["chosen"], "chosen", where)
    p_r, rejected = _split_conversation(row["rejected"], "rejected", where)
    if p_c != p_r:
        j = next((j for j, (a, b) in enumerate(zip(p_c, p_r)) if a != b), min(len(p_c), len(p_r)))
        show = lambda p: repr(p[j]["content"][:60]) if j < len(p) else "(no message)"  # noqa: E731
        raise ValueError(
            f"{where}: chosen and rejected conversations have different prompts (every message up to the last "
            f"user turn must match): they differ at message {j}: chosen {show(p_c)} vs rejected {show(p_r)}. "
            "Both must answer the same prompt; fix or drop the row."
        )
    return p_c, chosen, rejected


def _ranking(row: dict, k: int, where: str) -> list[int]:
    """Completion indices best first, from `ranking` (a permutation) or `scores` (no ties)."""
    if "ranking" in row:
        ranking = row["ranking"]
        if not isinstance(ranking, list) or not ranking:
            raise ValueError(f"{where}: `ranking` must be a list of completion indices best first, got {ranking!r}.")
        ties = [r for r in ranking if isinstance(r, list) and len(r) > 1]
        if ties:
            raise ValueError(
                f"{where}: `ranking` has tied completions {ties[0]}; rankings must be strict. Break the tie, "
                "drop one of the tied completions, or give `scores` and use pairs without ties."
            )
        flat = [r[0] if isinstance(r, list) and len(r) == 1 else r for r in ranking]
        if not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < k for r in flat):
            raise ValueError(f"{where}: `ranking` entries must be completion indices in 0..{k - 1}, got {ranking}.")
        missing = sorted(set(range(k)) - set(flat))
        if missing or len(flat) != k:
            dupes = sorted({r for r in flat if flat.count(r) > 1})
            raise ValueError(
                f"{where}: `ranking` {ranking} must list each of the {k} completions exactly once; missing "
                f"{missing}{f', repeated {dupes}' if dupes else ''}. Rank every completion or drop the unranked ones."
            )
        return flat
    scores = row["scores"]
    if not isinstance(scores, list) or len(scores) != k:
        raise ValueError(f"{where}: `scores` must be a list of {k} numbers (one per completion), got {scores!r}.")
    values = [_number(s, "every score", where) for s in scores]
    order = sorted(range(k), key=lambda i: -values[i])
    for a, b in zip(order, order[1:]):
        if values[a] == values[b]:
            raise ValueError(
                f"{where}: completions {a} and {b} are tied (both scored {values[a]}); a ranking needs distinct "
                "scores. Drop one of them, or turn the row into pairs without ties."
            )
    return order


def parse_preference_row(row: Any, where: str) -> PreferenceGroup:
    """Validate one pairwise, messages-style or ranked row into a `PreferenceGroup`."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be an object with named columns, got {type(row).__name__}.")
    if "completions" in row and ("ranking" in row or "scores" in row):
        if "prompt" not in row:
            raise ValueError(f"{where}: ranked rows need a `prompt` column next to `completions`; found {sorted(row)}.")
        check_prompt(row["prompt"], where)
        completions = row["completions"]
        if not isinstance(completions, list) or len(completions) < 2:
            raise ValueError(f"{where}: `completions` must be a list of >= 2 completions to rank, got {completions!r}.")
        completions = [_completion(c, f"completion {i}", where) for i, c in enumerate(completions)]
        order = _ranking(row, len(completions), where)
        ranked = tuple(completions[i] for i in order)
        if len({str(c) for c in ranked}) < len(ranked):
            raise ValueError(f"{where}: `completions` has identical entries; a ranking needs distinct completions.")
        scores = tuple(float(row["scores"][i]) for i in order) if "scores" in row else None
        return PreferenceGroup(row["prompt"], ranked, scores, None, row, where)
    if "chosen" not in row or "rejected" not in row:
        found = sorted(row)
        missing = [c for c in ("chosen", "rejected") if c not in row]
        raise ValueError(
            f"{where}: preference rows need `chosen` and `rejected` (missing {missing}; found columns {found}), "
            "or `completions` with `ranking`/`scores`. Rename the columns or drop the row."
        )
    if "prompt" in row:
        check_prompt(row["prompt"], where)
        prompt = row["prompt"]
        chosen = _completion(row["chosen"], "chosen", where)
        rejected = _completion(row["rejected"], "rejected", where)
    else:
        prompt, chosen, rejected = _messages_pair(row, where)
        check_completion(chosen, f"{where} (chosen)")
        check_completion(rejected, f"{where} (rejected)")
    if chosen == rejected:
        raise ValueError(
            f"{where}: chosen and rejected are identical ({str(chosen)[:60]!r}); a pair needs two "
            "different completions. Drop the row."
        )
    scores = None
    if "chosen_score" in row and "rejected_score" in row:
        scores = (
            _number(row["chosen_score"], "chosen_score", where),
            _number(row["rejected_score"], "rejected_score", where),
        )
    margin = (
        _number(row["margin"], "margin", where)
        if row.get("margin") is not None
        else (scores[0] - scores[1] if scores else None)
    )
    return PreferenceGroup(prompt, (chosen, rejected), scores, margin, row, where)


def parse_preference_rows(rows: Sequence[Any], where: str = "dataset") -> list[PreferenceGroup]:
    """Every row validated (errors name the 1-based row of `where`)."""
    if not rows:
        raise ValueError(f"{where}: no rows.")
    return [parse_preference_row(row, row_where(i, where)) for i, row in enumerate(rows)]


def to_pairs(groups: Sequence[PreferenceGroup], mode: Literal["all", "best_worst"] = "all") -> list[PreferenceGroup]:
    """K = 2 groups: all C(K,2) ordered pairs of each ranking, or only best vs worst."""
    pairs = []
    for g in groups:
        idx = [(0, g.k - 1)] if mode == "best_worst" else [(i, j) for i in range(g.k) for j in range(i + 1, g.k)]
        for i, j in idx:
            scores = (g.scores[i], g.scores[j]) if g.scores else None
            margin = g.margin if g.k == 2 else (scores[0] - scores[1] if scores else None)
            pair = (g.completions[i], g.completions[j])
            pairs.append(PreferenceGroup(g.prompt, pair, scores, margin, g.row, g.where))
    return pairs


def _label(value: Any, allowed: tuple, what: str, where: str) -> int:
    if isinstance(value, bool):
        return {True: allowed[-1], False: allowed[0]}[value]
    if isinstance(value, (int, float)) and value in allowed:
        return int(value)
    raise ValueError(f"{where}: {what} must be one of {list(allowed)} or a bool, got {value!r}. Fix or drop the row.")


def _rows_with(rows: Sequence[Any], where: str, columns: tuple[str, ...], needs: str) -> Iterator[tuple[dict, str]]:
    """Each row with its name (`row_where`), checked to be an object with ``columns`` (``needs`` says which, in
    the error) and a valid prompt."""
    for i, row in enumerate(rows):
        name = row_where(i, where)
        if not isinstance(row, dict) or any(c not in row for c in columns):
            found = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{name}: {needs}; found {found}.")
        check_prompt(row["prompt"], name)
        yield row, name


def parse_labelled_rows(rows: Sequence[Any], where: str = "dataset") -> list[LabelledExample]:
    """Unpaired rows {prompt, completion, label} (KTO, ORM), label 1 = desirable/correct."""
    needs = "unpaired rows need columns prompt, completion, label (0/1)"
    return [
        LabelledExample(
            row["prompt"],
            _completion(row["completion"], "completion", name),
            _label(row["label"], (0, 1), "label", name),
            name,
        )
        for row, name in _rows_with(rows, where, ("prompt", "completion", "label"), needs)
    ]


def parse_step_rows(rows: Sequence[Any], where: str = "dataset") -> list[LabelledExample]:
    """Stepwise rows {prompt, completions: [step, ...], labels: [-1/0/+1 or bool, ...]} (PRM)."""
    out = []
    needs = "stepwise rows need columns prompt, completions (steps), labels"
    for row, name in _rows_with(rows, where, ("prompt", "completions", "labels"), needs):
        steps, labels = row["completions"], row["labels"]
        if not isinstance(steps, list) or not steps or not isinstance(labels, list) or len(labels) != len(steps):
            raise ValueError(
                f"{name}: `completions` must be a non-empty list of steps with one label each in "
                f"`labels`, got {len(steps) if isinstance(steps, list) else steps!r} steps and "
                f"{len(labels) if isinstance(labels, list) else labels!r} labels."
            )
        for j, s in enumerate(steps):
            if not isinstance(s, str) or not s.strip() or STEP_SEPARATOR in s.strip():
                raise ValueError(
                    f"{name}: step {j} must be non-empty text without {STEP_SEPARATOR!r} "
                    f"(steps are joined with it), got {s!r}."
                )
        steps = tuple(s.strip() for s in steps)
        values = tuple(_label(v, (-1, 0, 1), f"label of step {j}", name) for j, v in enumerate(labels))
        out.append(LabelledExample(row["prompt"], STEP_SEPARATOR.join(steps), values, name, steps))
    return out
