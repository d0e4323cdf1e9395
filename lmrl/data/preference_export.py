"""`lmrl prefs`: a built-in preference source written as JSONL, e.g. the SFT rows of a DPO reference policy.

    lmrl prefs builtin:prefs-sft output_file=runs/prefs_sft.jsonl prompts=1000 seed=1   # SFT rows (sft/tiny_prefs)
    lmrl prefs builtin:prefs output_file=prefs.jsonl prompts=1000                       # the ranked pairs themselves

``builtin:prefs-sft`` is every completion of ``builtin:prefs`` as a prompt/completion row: the SFT data of a reference
policy that writes the kinds of answers the pairs rank (the setting DPO assumes). This module is torch-free: `lmrl.cli`
reads its config before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config import ConfigError, field


@dataclasses.dataclass
class PrefsConfig:
    source: Literal["builtin:prefs-sft", "builtin:prefs", "builtin:orm", "builtin:prm"] = field(
        "builtin:prefs-sft",
        "builtin:prefs-sft (every completion of builtin:prefs as a prompt/completion SFT row), builtin:prefs (ranked "
        "completions), builtin:orm (correct/incorrect labels) or builtin:prm (labelled steps)",
    )
    output_file: str = field("runs/prefs_sft.jsonl", "the JSONL file written (its folder is made)")
    prompts: int = field(1000, "prompts drawn (builtin:prefs-sft writes one row per completion of each)")
    split: Literal["train", "test"] = field("train", "split of the prompts (the two share none)")
    seed: int = field(0, "seed of the drawn prompts and completions")
    data_args: dict = field({}, "parameters of the source (preference_builtin), e.g. {digits: 1, num_completions: 4}")

    def __post_init__(self) -> None:
        if self.prompts < 1:
            raise ConfigError(f"'prompts' must be >= 1, got {self.prompts}.")


def run(config: PrefsConfig) -> int:
    """Write the rows; returns how many."""
    from lmrl.data.preference import export_rows
    from lmrl.tracking import console

    count = export_rows(
        config.source, config.output_file, config.prompts, config.split, config.seed, **config.data_args
    )
    console.print(f"wrote {count} rows of {config.source} ({config.split}) to {config.output_file}")
    return count
