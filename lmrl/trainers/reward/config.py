"""`lmrl reward`'s config: the reward-model loss, its data, and ``mode=score``.

Model, optimizer and run keys come from `TrainConfig`; the keys below are the reward trainer's own.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config import ConfigError, DataSection, TrainConfig, field


@dataclasses.dataclass
class RewardConfig(DataSection, TrainConfig):
    mode: Literal["train", "score"] = field(
        "train", "train a reward model, or score every row of `dataset` with the RM at `model`"
    )
    loss: Literal["bt", "plackett_luce", "orm", "prm"] = field(
        "bt", "bt (pairs; all C(K,2) pairs for K > 2), plackett_luce (rankings), orm, prm"
    )
    dataset: str = field("builtin:prefs", "builtin:prefs|orm|prm, a .jsonl/.json/.parquet/.csv file, or an HF dataset")
    data_args: dict = field({}, "arguments of a built-in source (digits, num_completions, kinds, seed, ...)")
    overlong: Literal["drop", "error"] = field("drop", "rows longer than max_length: drop them, or stop")
    batch_size: int = field(32, "prompts per optimizer step, each with all its K completions (split into grad_accum)")
    max_tokens_per_microbatch: int | None = field(
        None,
        "pack prompts (all K completions together) into micro-batches of at most this many tokens (positions restart per sequence; replaces grad_accum; null: padded rows)",
    )
    margin: bool = field(False, "bt, K = 2: subtract the row's margin (or chosen_score − rejected_score), Llama 2")
    center_coef: float = field(0.0, "bt, K = 2: + c·mean((r_c + r_r)²), keeps rewards centred (Eisenstein 2023)")
    scores_file: str | None = field(None, "mode=score: output JSONL (default: <output_dir>/scores.jsonl)")
    output_dir: str = field("runs/reward", "run directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}).")
        if self.center_coef < 0:
            raise ConfigError(f"'center_coef' must be >= 0, got {self.center_coef}.")
        if self.margin or self.center_coef:  # only then the registry (torch): a default config checks without it
            from lmrl.algorithms import REWARD_MODEL_LOSSES

            if not REWARD_MODEL_LOSSES.trait(self.loss, "margin", False):
                raise ConfigError(f"'margin' and 'center_coef' apply to loss=bt only, got loss={self.loss}.")
        if self.max_tokens_per_microbatch is not None and self.max_tokens_per_microbatch < self.max_length:
            raise ConfigError(
                f"max_tokens_per_microbatch={self.max_tokens_per_microbatch} packs prompts into "
                f"micro-batches of that many tokens: it must be >= max_length ({self.max_length})."
            )
