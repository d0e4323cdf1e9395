"""`lmrl distill`'s config (`lmrl.trainers.distill.trainer`), in a module of its own: `lmrl.cli` checks it without importing
torch."""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config import ConfigError, DecodingSection, field
from lmrl.rollout.engines.section import EngineSection
from lmrl.trainers.sft.config import SFTConfig


@dataclasses.dataclass
class DistillConfig(EngineSection, DecodingSection, SFTConfig):
    teacher: str = field(
        "", "the frozen teacher: a trained model directory (or hub id) sharing the student's tokenizer"
    )
    on_policy_frac: float = field(
        1.0,
        "lambda: fraction of each batch the student completes itself (1: on-policy distillation, 0: offline KD on the dataset's completions)",
    )
    divergence: Literal["auto", "forward", "reverse"] = field(
        "auto", "auto: forward KL on dataset completions, reverse KL on the student's own"
    )
    kd_temperature: float = field(
        1.0, "tau of the forward KL: both distributions softened by it, the loss scaled by tau^2"
    )
    max_new_tokens: int = field(32, "length cap of the student's on-policy completions")
    output_dir: str = field("runs/distill", "run directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.teacher:
            raise ConfigError(
                "distill needs a teacher: teacher=<trained model dir or hub id>, e.g. the final/ "
                "directory of an `lmrl sft` or `lmrl rl` run that used the student's tokenizer."
            )
        if not 0 <= self.on_policy_frac <= 1:
            raise ConfigError(f"'on_policy_frac' must be in [0, 1], got {self.on_policy_frac}.")
        if not self.kd_temperature > 0:
            raise ConfigError(f"'kd_temperature' must be > 0, got {self.kd_temperature}.")
        if self.multi_turn:
            raise ConfigError(
                "distill does not run tool episodes: remove tools/env (distil tool trajectories "
                "offline with `lmrl sft` data instead)."
            )
