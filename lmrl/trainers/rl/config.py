"""`lmrl rl`'s config: what each algorithm name means (`ALGORITHMS`) and the keys of online RL.

Sampling (`SamplingSection`), rewards (`RewardSection`), model, optimizer and run keys come from the
shared sections of `lmrl.config`; the keys below are online RL's own.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config import ConfigError, RewardSection, SamplingSection, Section, TrainConfig, check_at_least, field
from lmrl.parallel.config import env_world_size
from lmrl.rollout.engine_section import EngineSection
from lmrl.rollout.tools.section import ToolSection


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


GROUP_BASELINES = ("rloo", "grpo", "dr_grpo")
"""Advantage estimators whose baseline is the other samples of the same prompt: they need G >= 2."""


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


@dataclasses.dataclass
class RLConfig(PtxSection, ToolSection, SamplingSection, EngineSection, RewardSection, TrainConfig):
    algorithm: Literal["reinforce", "rloo", "grpo", "dr_grpo", "dapo", "gspo", "cispo", "ppo", "reinforce_pp"] = field(
        "grpo", "the method; sets the defaults below"
    )
    dataset: str = field("task:arithmetic", "prompts: task:<name>, a file or HF dataset with a prompt column")
    task_args: dict = field({}, "arguments of a built-in task")
    chat: bool = field(
        True,
        "prompt through the tokenizer's chat template (false: the raw prompt text with the tokenizer's own special tokens, e.g. a base model's BOS: 'zero' RL)",
    )
    prompt_template: str | None = field(
        None,
        "a template holding {prompt} that each prompt is put into first (e.g. R1-Zero's 'A conversation between User and Assistant. ... User: {prompt} Assistant:'); null: the prompt as is",
    )
    train_rows: int | None = field(2000, "prompts generated for a built-in task, or the first N rows of a dataset")
    eval_rows: int = field(200, "held-out prompts for eval/accuracy (built-in tasks)")
    prompts_per_step: int = field(16, "distinct prompts per step (B); a step trains on B*G completions")
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
    dynamic_sampling: Literal["off", "drop", "refill", "count"] | None = field(
        None,
        "groups whose G rewards are all equal (no signal): off, count (logged only), drop (not trained; algorithm=dapo's default) or refill (DAPO's dynamic sampling: replaced by groups of the next prompts of the data, sampled in up to max_refill_batches more rounds; docs/guide.md); null: the algorithm's",
    )
    max_refill_batches: int = field(
        4,
        "dynamic_sampling=refill: extra batches of prompts_per_step prompts a step may sample; at the bound it trains on the groups it has (rollout/refill_filled_frac < 1)",
    )
    kl_coef: float = field(0.0, "beta: weight of KL(policy || reference); 0 skips the reference model")
    kl_estimator: Literal["k1", "k2", "k3"] = field("k3", "per-token KL estimator")
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
    vf_coef: float = field(0.1, "PPO: value-loss weight")
    value_clip: float | None = field(0.2, "PPO: value clipping range")
    gamma: float = field(1.0, "PPO: discount")
    lam: float = field(0.95, "PPO: GAE lambda")
    value_init: str = field("policy", "PPO: value model backbone: policy, or a path to a causal LM / reward model")
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
        if self.advantage in GROUP_BASELINES and self.samples_per_prompt < 2:
            raise ConfigError(
                f"{self.algorithm} needs samples_per_prompt >= 2 (got {self.samples_per_prompt}): its "
                f"baseline is the other samples of the same prompt. Use samples_per_prompt=8, or "
                f"algorithm=reinforce (batch-mean baseline) for one sample per prompt."
            )
        if self.curriculum is not None and (len(self.curriculum) != 2 or self.curriculum[0] > self.curriculum[1]):
            raise ConfigError(
                f"'curriculum' must be [lo, hi] with lo <= hi (pass rates, e.g. [0.1, 0.9]), got {self.curriculum}."
            )
        for name in ("prompts_per_step", "ppo_epochs", "minibatches", "sample_every", "curriculum_sit_out"):
            if getattr(self, name) < 1:
                raise ConfigError(f"'{name}' must be >= 1, got {getattr(self, name)}.")
        if rows % (self.minibatches * self.grad_accum):
            raise ConfigError(
                f"prompts_per_step*samples_per_prompt ({rows}) must be divisible by minibatches*grad_accum "
                f"({self.minibatches}*{self.grad_accum})."
            )
        if self.max_tokens_per_microbatch is not None and (self.grad_accum != 1 or self.max_tokens_per_microbatch < 2):
            raise ConfigError(
                f"max_tokens_per_microbatch={self.max_tokens_per_microbatch} packs each minibatch's rows "
                f"into micro-batches of that many tokens: it replaces grad_accum (got {self.grad_accum}; "
                f"set 1) and must hold the longest prompt + completion."
            )
        self.check_knobs()
        self.check_correction()
        self.check_processes(self.nproc if self.nproc > 1 else env_world_size())
        check_at_least(self, ("async_steps",), 0)
        if self.placement == "ray":
            self.check_ray()
        elif self.async_steps:
            self.check_async_servers()
        if self.async_steps:
            self.check_async()
        if self.async_abort_on_push and (not self.async_steps or self.placement == "ray"):
            raise ConfigError(
                "async_abort_on_push re-sends requests queued on vLLM servers ahead of a weight push: it "
                f"applies to async_steps > 0 with engine=vllm and vllm_server(s) (got async_steps="
                f"{self.async_steps}, placement={self.placement}). Fix: async_abort_on_push=false, or "
                "async_steps on vLLM servers."
            )

    def check_knobs(self) -> None:
        """The loss knobs: ranges, and options that the algorithm's policy loss must declare."""
        check_at_least(self, ("entropy_coef", "entropy_coef_step"), 0)
        check_at_least(self, ("kl_horizon",), 1)
        if self.max_sampler_logp_gap is not None:
            check_at_least(self, ("max_sampler_logp_gap",), 0, inclusive=False)
        self.check_refill()
        bounds = [key for key in ("clip_ratio_c", "clip_delta") if getattr(self, key) is not None]
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
        if not 0 < self.top_entropy_quantile <= 1:
            raise ConfigError(
                f"top_entropy_quantile is the share of tokens trained, in (0, 1], got {self.top_entropy_quantile}."
            )
        if self.entropy_target is not None and not self.entropy_target > 0:
            raise ConfigError(f"entropy_target is a mean entropy in nats and must be > 0, got {self.entropy_target}.")
        if self.kl_target is not None and not (self.kl_target > 0 and self.kl_coef > 0):
            raise ConfigError(
                f"kl_target={self.kl_target} adapts kl_coef from its start value: it needs kl_target > 0 "
                f"and kl_coef > 0 (got kl_coef={self.kl_coef}), e.g. kl_coef=0.05 kl_target=0.1."
            )

    def check_correction(self) -> None:
        """The train-inference correction keys (lmrl.algorithms.mismatch): a level or mode needs tis_cap, bounds in
        range."""
        changed = [
            k
            for k, default in (("is_level", "token"), ("is_mode", "truncate"), ("is_low", None))
            if getattr(self, k) != default
        ]
        if self.tis_cap is None and changed:
            raise ConfigError(
                f"{', '.join(changed)} shape the importance weight that tis_cap turns on, but tis_cap=null"
                f". Fix: tis_cap=2.0 (the upper bound), or leave {', '.join(changed)} at the default."
            )
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ConfigError(
                f"tis_cap is an upper bound on the weight pi_learner/pi_sampler and must be > 0, got "
                f"{self.tis_cap}. Fix: tis_cap=2.0, or tis_cap=null to turn the correction off."
            )
        if self.is_low is not None and not (self.is_mode == "mask" and 0 <= self.is_low <= self.tis_cap):
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

    def check_refill(self) -> None:
        check_at_least(self, ("max_refill_batches",), 0)
        if self.dynamic_sampling != "refill":
            return
        if self.samples_per_prompt < 2:
            raise ConfigError(
                "dynamic_sampling=refill replaces groups whose samples_per_prompt rewards are all equal; "
                "with samples_per_prompt=1 every group is. Fix: samples_per_prompt >= 2."
            )
        if self.placement == "ray" or self.curriculum is not None:
            raise ConfigError(
                "dynamic_sampling=refill draws more prompts of the data stream during a step; placement="
                "ray samples ahead and a curriculum orders the data by the steps' rewards, neither "
                "with refill rounds yet. Fix: dynamic_sampling=drop, or placement=local without curriculum."
            )

    def check_ray(self) -> None:
        check_at_least(self, ("rollout_workers",), 1)
        check_at_least(self, ("worker_restarts",), 0)
        if self.prompts_per_step % self.rollout_workers:
            raise ConfigError(
                f"prompts_per_step={self.prompts_per_step} does not split over rollout_workers="
                f"{self.rollout_workers} (each samples whole groups). Fix: a multiple of it."
            )
        if self.curriculum is not None:
            raise ConfigError(
                "placement=ray samples ahead in the fixed data order; curriculum=[lo, hi] changes the "
                "order with each step's rewards. Fix: one of the two."
            )
        if self.nproc > 1 or env_world_size() > 1 or self.multi_turn or self.engine != "hf":
            raise ConfigError(
                "placement=ray runs one learner process with engine=hf single-turn rollout workers. "
                "Fix: nproc=1, engine=hf, no tools/environment (or placement=local)."
            )

    def check_async(self) -> None:
        if self.updates_per_step > 1 or self.tis_cap is None or self.advantage == "gae":
            raise ConfigError(
                "async_steps > 0 corrects stale samples with the importance weight against the sampler's "
                "log-probs: it needs tis_cap set, one update per step (ppo_epochs=minibatches=1) and no "
                "value model. Fix: async_steps=0 or those keys (is_mode=off turns the correction off "
                "explicitly, for ablations; docs/async.md)."
            )

    def check_async_servers(self) -> None:
        """placement=local async_steps: vLLM server(s) sample ahead (lmrl.rollout.samplers.server_ahead); nothing else can."""
        from lmrl.rollout.engine_section import server_list

        if self.engine != "vllm" or not server_list(self):
            raise ConfigError(
                f"async_steps={self.async_steps} samples ahead while the learner trains: on Ray rollout "
                "workers (placement=ray) or on vLLM servers (engine=vllm vllm_server=host:port, "
                "vllm_servers=[...] or vllm_replicas=N); "
                f"{'engine=vllm without a server' if self.engine == 'vllm' else 'engine=hf'} samples in "
                "the learner's process, with the learner's weights. Fix: async_steps=0, placement=ray, "
                "or a vLLM server."
            )
        if self.nproc > 1 or env_world_size() > 1 or self.multi_turn or self.curriculum is not None:
            raise ConfigError(
                "async_steps on vLLM servers samples ahead in the fixed data order for one learner "
                "process, single-turn. Fix: nproc=1, no tools/environment and no curriculum (or "
                "async_steps=0)."
            )
        if (self.dynamic_sampling or self.preset.dynamic_sampling) == "refill":
            raise ConfigError(
                "dynamic_sampling=refill draws more prompts during a step, which async_steps cannot "
                "sample ahead. Fix: dynamic_sampling=drop, or async_steps=0."
            )

    def check_processes(self, world: int) -> None:
        """Several processes: each samples whole groups of its shards and every rank runs the same number of
        forwards (FSDP); the curriculum is refused here."""
        if world == 1:
            return
        if (self.prompts_per_step // world * self.samples_per_prompt) % (self.minibatches * self.grad_accum):
            raise ConfigError(
                f"each of the {world} processes trains on prompts_per_step/{world} x samples_per_prompt "
                f"rows, which must split into minibatches*grad_accum ({self.minibatches}*"
                f"{self.grad_accum}). Fix: raise prompts_per_step or lower grad_accum."
            )
        if self.curriculum is not None:
            raise ConfigError(
                "curriculum (the data order depends on every rank's rewards) does not run on several "
                "processes yet (docs/scale.md). Fix: nproc=1."
            )

    @property
    def preset(self) -> Preset:
        return ALGORITHMS[self.algorithm]

    @property
    def advantage(self) -> str:
        return self.preset.advantage

    @property
    def updates_per_step(self) -> int:
        return self.ppo_epochs * self.minibatches
