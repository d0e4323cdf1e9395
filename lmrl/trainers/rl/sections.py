"""The sections of `lmrl rl`'s own keys: the policy update, the train-inference correction, where rollouts run, the
training forward's speed and memory, the PPO value model and the pretraining mix.

`RLConfig` composes them (flat keys outside: ``kl_coef=0.05``); inside, each is a typed view (``config.update``,
``config.correction``, ``config.sampler``, ``config.memory``, ``config.value``, ``config.ptx``) that a consumer
takes instead of the run's whole config. The rules between them and the other sections are `lmrl.config_rules`'.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config import ConfigError, Section, check_at_least, field, section_view


@dataclasses.dataclass
class UpdateSection(Section):
    """How a batch of rollouts updates the policy: passes, clipping, entropy and KL terms, aggregation, scaling."""

    title = "policy update"
    ppo_epochs: int = field(1, "passes over each batch of rollouts")
    minibatches: int = field(1, "optimizer steps per pass (the B*G rows are split evenly)")
    clip_low: float | None = field(None, "lower ratio clip (default: the algorithm's)")
    clip_high: float | None = field(None, "upper ratio clip (default: the algorithm's)")
    clip_ratio_c: float | None = field(
        None,
        "dual-clip PPO c > 1 (Ye et al. 2020, verl clip_ratio_c, e.g. 3.0): a token with negative advantage loses at most -A*c, however large its ratio (null: off; ppo loss only)",
    )
    clip_delta: float | None = field(
        None,
        "INTELLECT-2 two-sided clip delta > 1 + clip_high (TRL delta, e.g. 4.0): the unclipped ratio is capped at delta (null: off; ppo loss only)",
    )
    entropy_coef: float = field(
        0.0,
        "entropy bonus: loss -= entropy_coef * the policy's mean entropy, aggregated like the policy loss (0: off; > 0 builds the full logits, no chunked LM head)",
    )
    entropy_target: float | None = field(
        None,
        "adaptive entropy control (Skywork-OR1): entropy_coef (the start value) moves by entropy_coef_step each step towards keeping the mean entropy at this target (nats; null: fixed)",
    )
    entropy_coef_step: float = field(0.005, "entropy_target: the step of the coefficient per optimizer step")
    top_entropy_quantile: float = field(
        1.0,
        "train the policy loss only on this top share of each micro-batch's tokens by entropy (0.2: the 80/20 forking tokens of Wang et al. 2025; 1: every token)",
    )
    mask_truncated: bool = field(
        False,
        "completions that hit max_new_tokens get loss mask 0 (DAPO overlong filtering); their rewards still count in the baselines",
    )
    kl_target: float | None = field(
        None,
        "adaptive KL (Ziegler et al. 2019): kl_coef (the start value) is scaled each step by 1 + clip(kl/kl_target - 1, +-0.2) * completions/kl_horizon (null: fixed)",
    )
    kl_horizon: int = field(10000, "kl_target: completions over which kl_coef may move by about e^0.2")
    loss_agg: Literal["token_mean", "seq_mean", "seq_sum_norm"] | None = field(
        None, "loss aggregation (default: the algorithm's)"
    )
    adv_scale: Literal["group", "batch", "none"] = field("group", "GRPO advantage scaling by std (none = Dr. GRPO)")
    kl_coef: float = field(0.0, "beta: weight of KL(policy || reference); 0 skips the reference model")
    kl_estimator: Literal["k1", "k2", "k3"] = field("k3", "per-token KL estimator")

    def __post_init__(self) -> None:
        check_at_least(self, ("ppo_epochs", "minibatches", "kl_horizon"), 1)
        check_at_least(self, ("entropy_coef", "entropy_coef_step"), 0)
        if not 0 < self.top_entropy_quantile <= 1:
            raise ConfigError(
                f"top_entropy_quantile is the share of tokens trained, in (0, 1], got {self.top_entropy_quantile}."
            )
        if self.entropy_target is not None and not self.entropy_target > 0:
            raise ConfigError(f"entropy_target is a mean entropy in nats and must be > 0, got {self.entropy_target}.")
        super().__post_init__()

    @property
    def updates_per_step(self) -> int:
        return self.ppo_epochs * self.minibatches

    @property
    def update(self) -> UpdateSection:
        return section_view(self, UpdateSection)


@dataclasses.dataclass
class CorrectionSection(Section):
    """The train-inference correction (`lmrl.algorithms.mismatch`) and the sampler log-prob gap alarm."""

    title = "train-inference correction"
    tis_cap: float | None = field(
        2.0,
        "train-inference correction (docs/async.md): upper bound on the importance weight pi_learner/pi_sampler, its cap (is_mode=truncate) or the top of the kept band (is_mode=mask); null: off. Keep it on with engine=vllm (other numerics) and async_steps (stale weights)",
    )
    is_level: Literal["token", "sequence", "geometric"] = field(
        "token",
        "tis_cap: the weight per token, per row (product of the token ratios) or per row as their geometric mean",
    )
    is_mode: Literal["truncate", "mask", "off"] = field(
        "truncate",
        "tis_cap: truncate (TIS, w -> min(w, tis_cap)), mask (MIS: weight 0 outside [is_low, tis_cap]) or off (weights only logged, for ablations)",
    )
    is_low: float | None = field(None, "is_mode=mask: lower end of the kept band (null: 1/tis_cap)")
    offpolicy_mask_threshold: float | None = field(
        None,
        "off-policy sequence mask (DeepSeek-V3.2): drop rows whose mean log(pi_learner/pi_sampler) per token exceeds this in absolute value, in nats (e.g. 0.5; null: off)",
    )
    offpolicy_mask_rows: Literal["all", "negative"] = field(
        "all",
        "offpolicy_mask_threshold: all rows, or only negative-advantage tokens of rows the sampler found more likely (DeepSeek-V3.2's rule)",
    )
    max_sampler_logp_gap: float | None = field(
        0.1,
        "fp32 runs: warn loudly when a step's sampler_logp_gap (mean |log pi_learner - log pi_sampler|) exceeds this: a broken weight sync (a correct one stays near 1e-5; broken ones measured 0.7-6.6). null: off; not checked in bf16 or with async_steps",
    )
    stop_on_sampler_logp_gap: bool = field(
        False, "stop the run (exit 1, last checkpoint kept) instead of warning when max_sampler_logp_gap is exceeded"
    )

    def __post_init__(self) -> None:
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ConfigError(
                f"tis_cap is an upper bound on the weight pi_learner/pi_sampler and must be > 0, got "
                f"{self.tis_cap}. Fix: tis_cap=2.0, or tis_cap=null to turn the correction off."
            )
        if (
            self.is_low is not None
            and self.tis_cap is not None
            and not (self.is_mode == "mask" and 0 <= self.is_low <= self.tis_cap)
        ):
            raise ConfigError(
                f"is_low={self.is_low} is the lower end of the kept band of is_mode=mask and must be in "
                f"[0, tis_cap={self.tis_cap}] (got is_mode={self.is_mode}). Fix: is_mode=mask with "
                f"0 <= is_low <= tis_cap, or is_low=null."
            )
        if self.offpolicy_mask_threshold is not None and not self.offpolicy_mask_threshold > 0:
            raise ConfigError(
                f"offpolicy_mask_threshold is a mean log-ratio per token in nats and must be > 0, got "
                f"{self.offpolicy_mask_threshold}. Fix: e.g. 0.5, or null (off)."
            )
        if self.max_sampler_logp_gap is not None:
            check_at_least(self, ("max_sampler_logp_gap",), 0, inclusive=False)
        super().__post_init__()

    @property
    def correction(self) -> CorrectionSection:
        return section_view(self, CorrectionSection)


@dataclasses.dataclass
class SamplerSection(Section):
    """Where rollouts are sampled: in the trainer, on Ray rollout workers, or ahead of the learner (async)."""

    title = "where rollouts run"
    placement: Literal["local", "ray"] = field(
        "local",
        "local: sample in the trainer process(es); ray: rollout_workers Ray actors sample, this process learns (lmrl[ray])",
    )
    rollout_workers: int = field(
        2, "placement=ray: rollout-worker actors (each samples prompts_per_step/rollout_workers prompts a step)"
    )
    async_steps: int = field(
        0,
        "placement=ray, or engine=vllm with vllm_server(s): sample up to this many steps ahead while the learner trains, with weights at most this many updates old (0: synchronous; docs/async.md)",
    )
    async_abort_on_push: bool = field(
        False,
        "async_steps on vLLM servers: a weight push cancels the queued requests that have not started and sends them again after it (they sample the new weights; staleness drops; which requests depends on timing). false: they finish on the old weights (docs/async.md)",
    )
    worker_restarts: int = field(3, "placement=ray: dead workers replaced in a row before the run stops")
    ray_address: str | None = field(
        None, "placement=ray: a Ray cluster to join (null: RAY_ADDRESS, or a local cluster)"
    )

    def __post_init__(self) -> None:
        check_at_least(self, ("async_steps",), 0)
        if self.placement == "ray":
            check_at_least(self, ("rollout_workers",), 1)
            check_at_least(self, ("worker_restarts",), 0)
        super().__post_init__()

    @property
    def samples_ahead(self) -> bool:
        """Rollouts are sampled ahead of the learner, in the fixed data order (Ray workers, or async_steps)."""
        return self.placement == "ray" or self.async_steps > 0

    @property
    def sampler(self) -> SamplerSection:
        return section_view(self, SamplerSection)


@dataclasses.dataclass
class MemorySection(Section):
    """The training forward's speed and memory: shared prompts, reused sampling outputs, packing, skipped rows."""

    title = "training forward: speed and memory"
    share_prompts: bool = field(
        True, "forward each prompt once per group in training and scoring (same result, fewer FLOPs)"
    )
    reuse_sampling_forward: bool | None = field(
        None,
        "one update per batch: the training forward reuses each linear layer's output from sampling instead of recomputing it (lmrl.models.replay; same gradients up to rounding, a third fewer training FLOPs). null: on when the HF engine samples on a CPU, off on a GPU (the record costs more memory and sampling time there than the recompute saves: docs/gpu.md)",
    )
    max_tokens_per_microbatch: int | None = field(
        None,
        "training forwards pack each minibatch's rows into micro-batches of at most this many tokens (positions restart per row; replaces grad_accum, share_prompts and reuse_sampling_forward; null: padded rows)",
    )
    skip_zero_advantage: bool = field(
        True,
        "no forward/backward for rows whose advantage is 0 when their gradient is exactly 0 (no KL loss, no value model)",
    )

    @property
    def memory(self) -> MemorySection:
        return section_view(self, MemorySection)


@dataclasses.dataclass
class ValueSection(Section):
    """PPO's value model and GAE."""

    title = "PPO value model"
    vf_coef: float = field(0.1, "PPO: value-loss weight")
    value_clip: float | None = field(0.2, "PPO: value clipping range")
    gamma: float = field(1.0, "PPO: discount")
    lam: float = field(0.95, "PPO: GAE lambda")
    value_init: str = field("policy", "PPO: value model backbone: policy, or a path to a causal LM / reward model")

    @property
    def value(self) -> ValueSection:
        return section_view(self, ValueSection)


@dataclasses.dataclass
class PtxSection(Section):
    title = "pretraining mix (PPO-ptx)"
    ptx_coef: float = field(
        0.0,
        "PPO-ptx gamma (lmrl.trainers.rl.ptx): weight of the pretraining log-likelihood term added to the RL loss (0: off)",
    )
    ptx_dataset: str | None = field(
        None,
        "pretraining text for the term and for eval/ptx_ce (forgetting): builtin:pydoc, a .txt file or a dataset with a text column",
    )
    ptx_batch_size: int = field(8, "windows of pretraining text per optimizer step")
    ptx_block_size: int = field(64, "tokens per window")

    def __post_init__(self) -> None:
        check_at_least(self, ("ptx_coef",), 0)
        check_at_least(self, ("ptx_batch_size", "ptx_block_size"), 1)
        if self.ptx_coef > 0 and not self.ptx_dataset:
            raise ConfigError(
                f"ptx_coef={self.ptx_coef} needs pretraining text: ptx_dataset=builtin:pydoc, a .txt "
                "file or a dataset with a text column."
            )
        super().__post_init__()

    @property
    def ptx(self) -> PtxSection:
        return section_view(self, PtxSection)
