"""`lmrl rl`'s config: what each algorithm name means (`ALGORITHMS`) and the keys of online RL.

Data (`RowsSection`, `TaskSection`), sampling (`SamplingSection`), rewards (`RewardSection`), model, optimizer and
run keys come from the shared sections of `lmrl.config`; the update, correction, sampler, memory, value-model and
pretraining-mix keys from `lmrl.trainers.rl.sections`; the keys below are online RL's own. The rules between them
are `lmrl.config_rules`'.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config import (
    ConfigError,
    RewardSection,
    RowsSection,
    SamplingSection,
    TaskSection,
    TrainConfig,
    check_at_least,
    field,
)
from lmrl.rollout.engines.section import EngineSection
from lmrl.rollout.tools.section import ToolSection
from lmrl.trainers.rl.sections import (
    CorrectionSection,
    MemorySection,
    PtxSection,
    SamplerSection,
    UpdateSection,
    ValueSection,
)


@dataclasses.dataclass(frozen=True)
class Preset:
    """What an algorithm name means: advantage estimator, policy loss and their defaults."""

    advantage: str  # registry name, or "gae" (value model)
    loss: str
    clip: tuple[float, float] = (0.2, 0.2)
    agg: str = "token_mean"
    dynamic_sampling: str = "off"
    kl_in: str = "loss"


ALGORITHMS: dict[str, Preset] = {
    "reinforce": Preset("reinforce", "pg"),
    "rloo": Preset("rloo", "pg"),
    "grpo": Preset("grpo", "ppo"),
    "dr_grpo": Preset("dr_grpo", "ppo", agg="seq_sum_norm"),
    "dapo": Preset("grpo", "ppo", clip=(0.2, 0.28), dynamic_sampling="drop"),
    "gspo": Preset("grpo", "gspo", clip=(3e-4, 4e-4), agg="seq_mean"),
    "cispo": Preset("grpo", "cispo", clip=(1.0, 0.28)),
    "reinforce_pp": Preset("reinforce_pp", "ppo"),
    "ppo": Preset("gae", "ppo", kl_in="reward"),
}


@dataclasses.dataclass
class RLConfig(
    PtxSection,
    ValueSection,
    MemorySection,
    SamplerSection,
    CorrectionSection,
    UpdateSection,
    ToolSection,
    SamplingSection,
    EngineSection,
    RewardSection,
    TaskSection,
    RowsSection,
    TrainConfig,
):
    algorithm: Literal["reinforce", "rloo", "grpo", "dr_grpo", "dapo", "gspo", "cispo", "ppo", "reinforce_pp"] = field(
        "grpo", "the method; sets the defaults below"
    )
    prompt_template: str | None = field(
        None,
        "a template holding {prompt} that each prompt is put into first (e.g. R1-Zero's 'A conversation between User and Assistant. ... User: {prompt} Assistant:'); null: the prompt as is",
    )
    prompts_per_step: int = field(16, "distinct prompts per step (B); a step trains on B*G completions")
    dynamic_sampling: Literal["off", "drop", "refill", "count"] | None = field(
        None,
        "groups whose G rewards are all equal (no signal): off, count (logged only), drop (not trained; algorithm=dapo's default) or refill (DAPO's dynamic sampling: replaced by groups of the next prompts of the data, sampled in up to max_refill_batches more rounds; docs/guide.md); null: the algorithm's",
    )
    max_refill_batches: int = field(
        4,
        "dynamic_sampling=refill: extra batches of prompts_per_step prompts a step may sample; at the bound it trains on the groups it has (rollout/refill_filled_frac < 1)",
    )
    lr: float = field(1e-4, "peak learning rate")
    warmup_steps: int = field(0, "linear warmup (optimizer steps)")
    lr_schedule: Literal["cosine", "linear", "constant"] = field("constant", "decay after warmup")
    curriculum: list[float] | None = field(
        None,
        "[lo, hi]: online difficulty curriculum: a prompt whose group pass rate (mean reward) left [lo, hi] sits out the next curriculum_sit_out epochs",
    )
    curriculum_sit_out: int = field(1, "epochs an out-of-range prompt sits out")
    sample_every: int = field(10, "log num_samples completions with their rewards every N steps")
    output_dir: str = field("runs/rl", "run directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        rows = self.prompts_per_step * self.samples_per_prompt
        if self.curriculum is not None and (len(self.curriculum) != 2 or self.curriculum[0] > self.curriculum[1]):
            raise ConfigError(
                f"'curriculum' must be [lo, hi] with lo <= hi (pass rates, e.g. [0.1, 0.9]), got {self.curriculum}."
            )
        check_at_least(self, ("prompts_per_step", "sample_every", "curriculum_sit_out"), 1)
        check_at_least(self, ("max_refill_batches",), 0)
        if rows % (self.minibatches * self.grad_accum):
            raise ConfigError(
                f"prompts_per_step*samples_per_prompt ({rows}) must be divisible by minibatches*grad_accum "
                f"({self.minibatches}*{self.grad_accum})."
            )
        if self.max_tokens_per_microbatch is not None and self.max_tokens_per_microbatch < 2:
            raise ConfigError(
                f"max_tokens_per_microbatch={self.max_tokens_per_microbatch} packs each minibatch's rows into "
                "micro-batches of that many tokens: it must hold the longest prompt + completion."
            )
        self.check_loss_options()
        self.check_processes(self.processes)
        if self.placement == "ray" and self.prompts_per_step % self.rollout_workers:
            raise ConfigError(
                f"prompts_per_step={self.prompts_per_step} does not split over rollout_workers="
                f"{self.rollout_workers} (each samples whole groups). Fix: a multiple of it."
            )

    def check_loss_options(self) -> None:
        """The ratio bounds that the algorithm's policy loss must declare."""
        bounds = [k for k, v in (("clip_ratio_c", self.clip_ratio_c), ("clip_delta", self.clip_delta)) if v is not None]
        if bounds:  # only then the registry (it imports torch: a default config checks without it, lmrl.cli)
            from lmrl.algorithms import POLICY_LOSSES
            from lmrl.algorithms.registry import keyword_options

            own = keyword_options(POLICY_LOSSES.get(self.preset.loss))
        for key in bounds:
            if key not in own:
                raise ConfigError(
                    f"{key} bounds the ratio of the ppo policy loss; algorithm={self.algorithm} uses the "
                    f"'{self.preset.loss}' loss, which has no such option. Fix: {key}=null, or an "
                    f"algorithm with the ppo loss (grpo, dapo, ppo, reinforce_pp)."
                )

    def check_processes(self, world: int) -> None:
        """Several processes: each samples whole groups of its shards and every rank runs the same number of
        forwards (FSDP)."""
        if world > 1 and (self.prompts_per_step // world * self.samples_per_prompt) % (
            self.minibatches * self.grad_accum
        ):
            raise ConfigError(
                f"each of the {world} processes trains on prompts_per_step/{world} x samples_per_prompt "
                f"rows, which must split into minibatches*grad_accum ({self.minibatches}*"
                f"{self.grad_accum}). Fix: raise prompts_per_step or lower grad_accum."
            )

    @property
    def preset(self) -> Preset:
        return ALGORITHMS[self.algorithm]

    @property
    def advantage(self) -> str:
        return self.preset.advantage
