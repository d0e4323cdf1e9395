"""`lmrl sft`'s config (`lmrl.trainers.sft.trainer`), in a module of its own: `lmrl.cli` checks it without importing torch."""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config import ConfigError, DataSection, TaskSection, TrainConfig, field
from lmrl.rollout.tools.section import ToolSection


@dataclasses.dataclass
class SFTConfig(ToolSection, TaskSection, DataSection, TrainConfig):
    eval_max_new_tokens: int = field(32, "tokens generated per held-out prompt when measuring task accuracy")
    train_on: Literal["all", "last"] = field("all", "multi-turn: train every assistant turn or only the last")
    overlong: Literal["truncate", "drop", "error"] = field(
        "truncate", "what to do with examples longer than max_length"
    )
    batch_size: int = field(32, "examples per optimizer step (split into grad_accum micro-batches)")
    max_tokens_per_microbatch: int | None = field(
        None,
        "pack rows into micro-batches of at most this many tokens (positions restart per row, attention stays within a row; replaces grad_accum; null: padded rows)",
    )
    stop_at_accuracy: float | None = field(
        None, "stop early once held-out accuracy (built-in tasks) reaches this; checked every eval_every steps"
    )
    output_dir: str = field("runs/sft", "run directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size % self.grad_accum:
            raise ConfigError(
                f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}); "
                f"each micro-batch has batch_size/grad_accum examples."
            )
        if self.max_tokens_per_microbatch is not None and self.max_tokens_per_microbatch < self.max_length:
            raise ConfigError(
                f"max_tokens_per_microbatch={self.max_tokens_per_microbatch} packs rows into micro-batches "
                f"of that many tokens: it must be >= max_length ({self.max_length}) so that every row fits."
            )
