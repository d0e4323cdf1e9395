"""Preference data: where rows come from (built-in sources, files, HF datasets) and their export to JSONL (`export_rows`,
which `lmrl prefs` runs: `lmrl.data.preference_export`).

The rest of preference data lives in one module per job, and its names are re-exported here:
  `lmrl.data.preference_builtin`  the built-in arithmetic preference task (`gold_score`, builtin:prefs|orm|prm);
  `lmrl.data.preference_parsing`  the row formats, validated into `PreferenceGroup`/`LabelledExample`;
  `lmrl.data.preference_tokens`   tokenisation (`Tokenized`, `tokenize`, `step_positions`) and collation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmrl.data.loading import load_rows
from lmrl.data.preference_builtin import BUILTIN_SOURCES, gold_score, orm_rows, preference_rows, prm_rows
from lmrl.data.preference_parsing import (
    PreferenceGroup,
    parse_labelled_rows,
    parse_preference_row,
    parse_preference_rows,
    parse_step_rows,
    to_pairs,
)
from lmrl.data.preference_tokens import Tokenized, collate_completions, collate_sequences, step_positions, tokenize

__all__ = [
    # defined here
    "DEFAULT_BUILTIN_ROWS",
    "completion_rows",
    "export_rows",
    "load_preference_rows",
    # re-exported for callers that use them as `prefs.X` (`from lmrl.data import preference as prefs`)
    "BUILTIN_SOURCES",
    "PreferenceGroup",
    "Tokenized",
    "collate_completions",
    "collate_sequences",
    "gold_score",
    "orm_rows",
    "parse_labelled_rows",
    "parse_preference_row",
    "parse_preference_rows",
    "parse_step_rows",
    "preference_rows",
    "prm_rows",
    "step_positions",
    "to_pairs",
    "tokenize",
]

DEFAULT_BUILTIN_ROWS = 1000


def completion_rows(rows: Sequence[dict]) -> list[dict]:
    """Every completion of preference rows as a {prompt, completion} row: SFT data for a reference policy
    that generates the same kinds of completions the preferences rank (the setting DPO assumes)."""
    out = []
    for row in rows:
        texts = row["completions"] if "completions" in row else [row["chosen"], row["rejected"]]
        out += [{"prompt": row["prompt"], "completion": text} for text in texts]
    return out


def load_preference_rows(source: str, split: str = "train", limit: int | None = None, **data_args: Any) -> list[dict]:
    """Rows of a built-in source (`builtin:prefs|orm|prm`, `data_args` are its parameters plus `seed`)
    or of any source `lmrl.data.loading.load_rows` reads (files, HF datasets)."""
    if source in BUILTIN_SOURCES:
        args = dict(data_args)
        n = int(args.pop("n", None) or limit or DEFAULT_BUILTIN_ROWS)
        try:
            return BUILTIN_SOURCES[source](n, split=split, **args)
        except TypeError as exc:
            raise ValueError(f"{source}: bad data_args {sorted(data_args)} ({exc}).") from exc
    if source.startswith("builtin:"):
        raise ValueError(f"unknown built-in preference source {source!r}; they are {sorted(BUILTIN_SOURCES)}.")
    return load_rows(source, split=split, limit=limit, **data_args)


def export_rows(
    source: str, path: str, n: int = DEFAULT_BUILTIN_ROWS, split: str = "train", seed: int = 0, **data_args: Any
) -> int:
    """Write `n` rows of a built-in source as JSONL; `source` "builtin:prefs-sft" writes `completion_rows` of
    builtin:prefs (SFT data for a reference policy). Returns the number of rows written."""
    import json
    from pathlib import Path

    sft = source == "builtin:prefs-sft"
    rows = load_preference_rows("builtin:prefs" if sft else source, split, n, seed=seed, **data_args)
    rows = completion_rows(rows) if sft else rows
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)
