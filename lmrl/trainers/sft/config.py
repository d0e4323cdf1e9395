"""`lmrl sft`'s config (`lmrl.trainers.sft.trainer`), in a module of its own: `lmrl.cli` checks it without importing torch."""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config import ConfigError, TrainConfig, field
from lmrl.rollout.tool_config import ToolSection


@dataclasses.dataclass
class SFTConfig(ToolSection, TrainConfig):
    dataset: str = field("task:arithmetic", "task:<name> (built-in), a .jsonl/.json/.parquet/.csv file, or an HF dataset id")
    task_args: dict = field({}, "arguments of a built-in task (e.g. digits: 2)")
    split: str = field("train", "dataset split")
    train_rows: int | None = field(2000, "rows generated for a built-in task, or the first N rows of a dataset (null: all)")
    eval_dataset: str | None = field(None, "held-out data; default: the test split of a built-in task, none for files")
    eval_split: str = field("test", "split of eval_dataset (or of the built-in task)")
    eval_rows: int = field(200, "held-out rows to evaluate on")
    eval_max_new_tokens: int = field(32, "tokens generated per held-out prompt when measuring task accuracy")
    chat: bool = field(True, "render rows with the chat template (False: raw prompt+completion text)")
    train_on: Literal["all", "last"] = field("all", "multi-turn: train every assistant turn or only the last")
    max_length: int = field(256, "tokens per example (prompt + completion)")
    overlong: Literal["truncate", "drop", "error"] = field("truncate", "what to do with examples longer than max_length")
    batch_size: int = field(32, "examples per optimizer step (split into grad_accum micro-batches)")
    max_tokens_per_microbatch: int | None = field(None, "pack rows into micro-batches of at most this many tokens (positions restart per row, attention stays within a row; replaces grad_accum; null: padded rows)")
    stop_at_accuracy: float | None = field(None, "stop early once held-out accuracy (built-in tasks) reaches this; checked every eval_every steps")
    output_dir: str = field("runs/sft", "run directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size % self.grad_accum:
            raise ConfigError(
                f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}); "
                f"each micro-batch has batch_size/grad_accum examples."
            )
        if self.max_tokens_per_microbatch is not None and (self.grad_accum != 1
                                                           or self.max_tokens_per_microbatch < self.max_length):
            raise ConfigError(f"max_tokens_per_microbatch={self.max_tokens_per_microbatch} packs rows into micro-batches "
                              f"of that many tokens: it replaces grad_accum (got {self.grad_accum}; set 1) and must be "
                              f">= max_length ({self.max_length}) so that every row fits.")
        if self.max_length < 2:
            raise ConfigError(f"'max_length' must be >= 2, got {self.max_length}.")
        if self.stop_at_accuracy is not None and not (0 < self.stop_at_accuracy <= 1 and self.eval_every > 0):
            raise ConfigError(f"stop_at_accuracy={self.stop_at_accuracy} needs a value in (0, 1] and eval_every > 0 "
                              f"(got eval_every={self.eval_every}): accuracy is checked at each evaluation.")
