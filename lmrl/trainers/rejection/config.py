"""`lmrl rejection-sampling`'s config (`lmrl.trainers.rejection.trainer`), in a module of its own: `lmrl.cli` checks it
without importing torch."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from lmrl.config import ConfigError, DataSection, RewardSection, TaskSection, TrainConfig, check_at_least, field
from lmrl.rollout.engines.section import EngineSection

if TYPE_CHECKING:
    from lmrl.rollout.types import SamplingParams


@dataclasses.dataclass
class RejectionConfig(EngineSection, RewardSection, TaskSection, DataSection, TrainConfig):
    train_rows: int | None = field(200, "prompts sampled each round (M); null: every row")
    eval_rows: int = field(100, "held-out prompts")
    eval_samples: int = field(
        4, "completions sampled per held-out prompt for eval/reward (and eval/gold_score, eval/kl)"
    )
    eval_gold: bool = field(
        False, "also report eval/gold_score, the hidden rule of the built-in preference task (arithmetic prompts only)"
    )
    eval_kl: bool = field(
        True,
        "report eval/kl: KL(π ‖ π_start) summed over completion tokens (k1 on sampled "
        "held-out completions; keeps the starting model in memory)",
    )
    samples_per_prompt: int = field(8, "completions sampled per prompt (N)")
    max_new_tokens: int = field(32, "completion length cap in tokens")
    temperature: float = field(1.0, "sampling temperature (book: 0.7-1.0)")
    top_p: float = field(1.0, "nucleus sampling")
    sample_top_k: int = field(0, "top-k sampling (0: off); not to be confused with top_k (selection)")
    generation_batch: int = field(64, "prompts per call of the rollout engine")
    sampling_shards: int = field(
        0,
        "the prompts of a round are sampled in this many shards, each with its own seeded generator (0: one per process); fixed, it makes the samples independent of the number of processes",
    )
    on_reward_error: Literal["stop"] = field(
        "stop",
        "each round's pool is scored once: a failing reward function stops the run (resume=true redoes the round)",
    )
    select: Literal["best", "top_k"] = field(
        "best", "best: the per_prompt best of each prompt; top_k: the top_k best over all prompts"
    )
    per_prompt: int = field(1, "select=best: completions kept per prompt")
    top_k: int | None = field(None, "select=top_k: completions kept in total (K)")
    min_reward: float | None = field(None, "never select a completion with a lower reward (e.g. 1 with a 0/1 verifier)")
    drop_truncated: bool = field(True, "never select completions that hit max_new_tokens without a stop")
    dedupe: bool = field(True, "never select a completion identical to a better one of the same prompt")
    rounds: int = field(1, "sample -> select -> SFT rounds; each samples from the previous round's policy")
    max_length: int = field(128, "SFT: tokens per example (prompt + completion)")
    batch_size: int = field(32, "SFT: examples per optimizer step")
    max_steps: int = field(100, "SFT optimizer steps per round")
    output_dir: str = field("runs/rejection", "run directory")
    sampled_key = "train_rows"  # what sampling_shards divide (`lmrl.parallel.config.check_world`)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.engine == "vllm" and self.processes > 1:
            raise ConfigError(
                "engine=vllm samples in one process here; with several processes each rank samples "
                "with engine=hf. Fix: engine=hf, or nproc=1."
            )
        check_at_least(self, ("rounds", "eval_samples", "generation_batch", "per_prompt", "max_new_tokens"), 1)
        if self.temperature <= 0:
            raise ConfigError(
                f"'temperature' must be > 0 (rejection sampling needs diverse samples), got {self.temperature}."
            )
        if self.per_prompt > self.samples_per_prompt:
            raise ConfigError(
                f"per_prompt={self.per_prompt} exceeds samples_per_prompt={self.samples_per_prompt}; "
                "keep at most the N completions drawn per prompt."
            )
        if self.select == "top_k":
            if self.top_k is None or self.top_k < 1:
                raise ConfigError("select=top_k needs top_k=K >= 1, the number of completions kept over all prompts.")
            available = None if self.train_rows is None else self.train_rows * self.samples_per_prompt
            if available is not None and self.top_k > available:
                raise ConfigError(
                    f"top_k={self.top_k} exceeds the {available} completions sampled per round "
                    f"(train_rows={self.train_rows} x samples_per_prompt={self.samples_per_prompt}); "
                    "lower top_k or sample more."
                )
        elif self.top_k is not None:
            raise ConfigError("top_k applies to select=top_k only; with select=best use per_prompt=k.")
        if not self.rewards:
            raise ConfigError("'rewards' is empty: name at least one reward (task, model:PATH, module:function).")
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}).")

    @property
    def sampling(self) -> SamplingParams:
        from lmrl.rollout.types import SamplingParams  # here: the config checks without torch (lmrl.cli)

        return SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.sample_top_k
        )
