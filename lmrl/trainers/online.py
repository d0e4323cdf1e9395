"""Online policy-gradient RL: REINFORCE, RLOO, PPO, GRPO, Dr. GRPO, DAPO, GSPO, CISPO.

One loop (RLHF book ch. 6), with parts picked by ``algorithm``:

1. sample ``prompts_per_step`` prompts and ``samples_per_prompt`` completions each (prompt-major);
2. score them with the reward functions (verifiers, user functions), log every component;
3. optionally drop zero-variance groups (DAPO dynamic sampling);
4. advantages from the registry (``reinforce``, ``rloo``, ``grpo``, ``dr_grpo``; PPO: GAE on a value model);
5. ``ppo_epochs`` x ``minibatches`` optimizer steps on a policy loss from the registry
   (``pg``, ``ppo``, ``gspo``, ``cispo``), with truncated importance sampling against the
   sampler's log-probs and an optional KL to a frozen reference (in the loss, or in the reward for PPO).

Deviations from the papers, on purpose: token-mean aggregation by default for every
algorithm except Dr. GRPO (seq_sum_norm) and GSPO (seq_mean); KL off by default with
verifiable rewards; the TIS weight is on (cap 2) because the KV-cached sampler and the
learner differ slightly in numerics.

Launch::

    lmrl rl --config rl/tiny_arithmetic_grpo                         # CPU, built-in model and task
    lmrl rl algorithm=dapo model=runs/sft/final prompts_per_step=32 samples_per_prompt=8
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

import torch

from lmrl.algorithms import advantages, gae, kl_penalized_rewards, policy_loss, value_loss, whiten, zero_variance_groups
from lmrl.config import ConfigError, TrainConfig, field
from lmrl.data.chat import render_prompt
from lmrl.data.loading import load_rows
from lmrl.eval.generation import task_accuracy
from lmrl.models import autocast, autocast_dtype, count_parameters, load_model, load_model_and_tokenizer
from lmrl.models.logprobs import completion_logprobs
from lmrl.models.value import ValueModel
from lmrl.rewards import RewardError, RewardSet
from lmrl.rollout.hf import HFEngine, SamplingParams
from lmrl.rollout.types import RolloutBatch
from lmrl.trainers import common


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
    "ppo": Preset("gae", "ppo", kl_in="reward"),
}


@dataclasses.dataclass
class RLConfig(TrainConfig):
    algorithm: Literal["reinforce", "rloo", "grpo", "dr_grpo", "dapo", "gspo", "cispo", "ppo"] = field("grpo", "the method; sets the defaults below")
    dataset: str = field("task:arithmetic", "prompts: task:<name>, a file or HF dataset with a prompt column")
    task_args: dict = field({}, "arguments of a built-in task")
    train_rows: int | None = field(2000, "prompts generated for a built-in task, or the first N rows of a dataset")
    eval_rows: int = field(200, "held-out prompts for eval/accuracy (built-in tasks)")
    prompts_per_step: int = field(16, "distinct prompts per step (B)")
    samples_per_prompt: int = field(8, "completions per prompt (G); a step trains on B*G completions")
    max_new_tokens: int = field(32, "completion length cap in tokens")
    temperature: float = field(1.0, "sampling temperature")
    top_p: float = field(1.0, "nucleus sampling")
    top_k: int = field(0, "top-k sampling (0: off)")
    rewards: list[str] = field(["task"], "reward functions: registry names or module:function")
    reward_weights: list[float] = field([], "one weight per reward (default 1.0 each)")
    reward_kwargs: dict = field({}, "options per reward name, e.g. {overlong: {max_len: 32, cache_len: 8}}")
    on_reward_error: Literal["skip", "stop"] = field("skip", "a failing reward function skips the step or stops the run")
    ppo_epochs: int = field(1, "passes over each batch of rollouts")
    minibatches: int = field(1, "optimizer steps per pass (the B*G rows are split evenly)")
    clip_low: float | None = field(None, "lower ratio clip (default: the algorithm's)")
    clip_high: float | None = field(None, "upper ratio clip (default: the algorithm's)")
    loss_agg: Literal["token_mean", "seq_mean", "seq_sum_norm"] | None = field(None, "loss aggregation (default: the algorithm's)")
    adv_scale: Literal["group", "batch", "none"] = field("group", "GRPO advantage scaling by std (none = Dr. GRPO)")
    dynamic_sampling: Literal["off", "drop", "count"] | None = field(None, "zero-variance groups: drop (DAPO) or only count")
    kl_coef: float = field(0.0, "beta: weight of KL(policy || reference); 0 skips the reference model")
    kl_estimator: Literal["k1", "k2", "k3"] = field("k3", "per-token KL estimator")
    tis_cap: float | None = field(2.0, "truncated importance-sampling cap on pi_learner/pi_sampler (null: off)")
    share_prompts: bool = field(True, "forward each prompt once per group in training and scoring (same result, fewer FLOPs)")
    reuse_sampling_forward: bool = field(True, "one update per batch: the training forward reuses each linear layer's output from sampling instead of recomputing it (lmrl.models.replay; same gradients up to rounding, a third fewer training FLOPs)")
    skip_zero_advantage: bool = field(True, "no forward/backward for rows whose advantage is 0 when their gradient is exactly 0 (no KL loss, no value model)")
    vf_coef: float = field(0.1, "PPO: value-loss weight")
    value_clip: float | None = field(0.2, "PPO: value clipping range")
    gamma: float = field(1.0, "PPO: discount")
    lam: float = field(0.95, "PPO: GAE lambda")
    value_init: str = field("policy", "PPO: value model backbone: policy, or a path to a causal LM / reward model")
    lr: float = field(1e-4, "peak learning rate")
    warmup_steps: int = field(0, "linear warmup (optimizer steps)")
    lr_schedule: Literal["cosine", "linear", "constant"] = field("constant", "decay after warmup")
    sample_every: int = field(10, "log num_samples completions with their rewards every N steps")
    output_dir: str = field("runs/rl", "run directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        rows = self.prompts_per_step * self.samples_per_prompt
        if self.advantage == "rloo" and self.samples_per_prompt < 2:
            raise ConfigError("RLOO needs samples_per_prompt >= 2: its baseline is the mean reward of the other samples of the same prompt.")
        if rows % (self.minibatches * self.grad_accum):
            raise ConfigError(f"prompts_per_step*samples_per_prompt ({rows}) must be divisible by minibatches*grad_accum "
                              f"({self.minibatches}*{self.grad_accum}).")
        if self.reward_weights and len(self.reward_weights) != len(self.rewards):
            raise ConfigError(f"reward_weights has {len(self.reward_weights)} entries for {len(self.rewards)} rewards {self.rewards}.")

    @property
    def preset(self) -> Preset:
        return ALGORITHMS[self.algorithm]

    @property
    def advantage(self) -> str:
        return self.preset.advantage

    @property
    def loss_options(self) -> dict[str, Any]:
        low, high = self.preset.clip
        opts: dict[str, Any] = {"agg": self.loss_agg or self.preset.agg, "max_len": self.max_new_tokens,
                                "tis_cap": self.tis_cap, "kl_estimator": self.kl_estimator}
        if self.preset.loss != "pg":
            opts.update(clip_low=self.clip_low if self.clip_low is not None else low,
                        clip_high=self.clip_high if self.clip_high is not None else high)
        return opts

    @property
    def updates_per_step(self) -> int:
        return self.ppo_epochs * self.minibatches


# ----------------------------------------------------------------------------- rollout and scoring


def repeat_columns(rows: list[dict[str, Any]], group_size: int) -> dict[str, list]:
    """Dataset columns of each prompt, repeated for its G completions (prompt-major)."""
    keys = [k for k in rows[0] if k not in ("prompt", "completion")]
    return {k: [row[k] for row in rows for _ in range(group_size)] for k in keys}


def rollout(engine: HFEngine, tokenizer, rows, config: RLConfig, step: int) -> RolloutBatch:
    texts = [render_prompt(tokenizer, row["prompt"]) for row in rows]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                            top_p=config.top_p, top_k=config.top_k)
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)  # resume-exact sampling
    # a recording is reused only by an update on the sampler's weights through the shared-prompt forward
    record = config.reuse_sampling_forward and config.share_prompts and config.updates_per_step == 1
    return engine.generate(ids, params, n=config.samples_per_prompt, generator=generator, record_linear_outputs=record)


def score(reward_set: RewardSet, batch: RolloutBatch, rows, group_size: int):
    columns = repeat_columns(rows, group_size)
    return reward_set.compute(batch.prompts, batch.completions, truncated=batch.truncated.tolist(),
                              completion_lengths=batch.completion_lengths.tolist(), **columns)


# ----------------------------------------------------------------------------- learning


@torch.no_grad()
def logprobs_no_grad(model, batch: RolloutBatch, config: RLConfig, dtype) -> torch.Tensor:
    return completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1],
                               temperature=config.temperature, autocast_dtype=dtype,
                               share_prompts=getattr(config, "share_prompts", False))


def minibatch_order(n: int, group_size: int, minibatches: int, generator: torch.Generator) -> torch.Tensor:
    """A random order of the n rows in which every minibatch holds whole groups (so prompts can be shared),
    when the groups split evenly into minibatches; else a random order of rows. One minibatch: the rows in order
    (the full-batch gradient does not depend on it, and in-order rows need no gathering)."""
    if minibatches == 1:
        return torch.arange(n)
    if n % group_size or (n // group_size) % minibatches:
        return torch.randperm(n, generator=generator)
    groups = torch.randperm(n // group_size, generator=generator)  # (n/G,)
    return (groups[:, None] * group_size + torch.arange(group_size)).flatten()  # (n,)


def zero_gradient_rows(adv: torch.Tensor, config: RLConfig, value_model, use_kl_loss: bool) -> torch.Tensor | None:
    """Rows (N,) bool whose policy-loss gradient is exactly 0: advantage 0 on every token, no KL term in the loss
    and no value loss (pg, ppo, gspo and cispo all scale each row's term by its advantage). None: skip nothing."""
    if not config.skip_zero_advantage or use_kl_loss or value_model is not None:
        return None
    return (adv == 0).all(dim=-1) if adv.dim() == 2 else adv == 0


def completion_values(value_model: ValueModel, batch: RolloutBatch, dtype) -> torch.Tensor:
    """V(s_t) for each completion token t: the value head at the position that predicts token t. (N, T)"""
    p, t = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    with autocast("cpu", dtype):
        values = value_model(batch.input_ids, batch.attention_mask)  # (N, P+T)
    return values[:, p - 1 : p + t - 1].float() * batch.completion_mask


def ppo_targets(value_model, batch, rewards, ref_logp, old_logp, config: RLConfig, dtype):
    """GAE advantages (whitened over completion tokens) and returns, on KL-shaped per-token rewards."""
    mask = batch.completion_mask
    with torch.no_grad():
        old_values = completion_values(value_model, batch, dtype)
    kl_tok = (old_logp - ref_logp) if ref_logp is not None else torch.zeros_like(old_logp)  # k1 in the reward
    token_rewards = kl_penalized_rewards(rewards, kl_tok, mask, config.kl_coef)
    adv, returns = gae(token_rewards, old_values, mask, config.gamma, config.lam)
    return whiten(adv, mask), returns, old_values


def update(parts, batch: RolloutBatch, adv, old_logp, ref_logp, returns, old_values,
           config: RLConfig, dtype, step: int, generator: torch.Generator) -> dict[str, float]:
    """ppo_epochs x minibatches optimizer steps on the batch; returns stats averaged over them.

    ``old_logp=None`` means on-policy with a single update: pi_old is the current policy, detached.
    """
    model, value_model = parts.model, parts.value_model
    opts = dict(config.loss_options)
    use_kl_loss = config.kl_coef > 0 and config.preset.kl_in == "loss"
    if use_kl_loss:
        opts["kl_coef"] = config.kl_coef
    totals: dict[str, float] = {}
    n = len(batch)
    skip = zero_gradient_rows(adv, config, value_model, use_kl_loss)  # (N,) or None
    trained_weight = 0.0  # share of the step's loss weight on trained rows: 1 unless rows were skipped
    params = [*model.parameters(), *(value_model.parameters() if value_model is not None else [])]
    for _ in range(config.ppo_epochs):
        order = minibatch_order(n, config.samples_per_prompt, config.minibatches, generator)
        for mb in order.chunk(config.minibatches):
            mb_tokens = batch.completion_mask[mb].sum().clamp(min=1)
            for micro in mb.chunk(config.grad_accum):
                if skip is not None:
                    totals["train/skipped_rows_frac"] = (totals.get("train/skipped_rows_frac", 0.0)
                                                         + skip[micro].float().sum().item() / n / config.ppo_epochs)
                    micro = micro[~skip[micro]]  # dropped rows add exactly 0 to the loss; the weights keep mb's size
                    if len(micro) == 0:
                        continue
                sub = batch.select(micro)
                mask = sub.completion_mask
                weight = (mask.sum() / mb_tokens) if opts["agg"] == "token_mean" else len(micro) / len(mb)
                logp, entropy = completion_logprobs(model, sub.input_ids, sub.attention_mask, sub.prompt_ids.shape[1],
                                                    temperature=config.temperature, return_entropy=True,
                                                    autocast_dtype=dtype, share_prompts=config.share_prompts,
                                                    linear_outputs=sub.linear_outputs)
                loss, stats = policy_loss(
                    config.preset.loss, logp, logp.detach() if old_logp is None else old_logp[micro], adv[micro], mask,
                    ref_logp=ref_logp[micro] if ref_logp is not None else None,
                    sampler_logp=sub.sampler_logp, **opts,
                )
                stats["loss/policy"] = loss.item()
                stats["entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
                if value_model is not None:
                    values = completion_values(value_model, sub, dtype)
                    vloss, vstats = value_loss(values, old_values[micro], returns[micro], mask, clip=config.value_clip)
                    loss = loss + config.vf_coef * vloss
                    stats.update(vstats, **{"loss/value": vloss.item()})
                common.check_finite(loss, step)
                (loss * weight).backward()
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + float(value) * float(weight) / config.updates_per_step
                trained_weight += float(weight) / config.updates_per_step
            if all(p.grad is None for p in params):  # every row skipped: step on the exact zero gradient (momentum)
                for p in params:
                    p.grad = torch.zeros_like(p) if p.requires_grad else None
            norm = common.optimizer_step(params, parts.optimizer, parts.scheduler, config.max_grad_norm, step)
            totals["grad_norm"] = totals.get("grad_norm", 0.0) + norm / config.updates_per_step
    # losses stay sums over all rows (skipped rows add exactly 0); statistics are means over the trained rows
    for key in totals:
        if trained_weight > 0 and not key.startswith(("loss/", "grad_norm", "train/")):
            totals[key] /= trained_weight
    return totals


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class Parts:
    """The live objects of a run that a step uses."""

    model: Any
    tokenizer: Any
    ref_model: Any
    value_model: ValueModel | None
    engine: HFEngine
    reward_set: RewardSet
    optimizer: torch.optim.Optimizer
    scheduler: Any


def rl_step(parts: Parts, rows: list[dict], config: RLConfig, dtype, step: int, tracker) -> dict[str, float]:
    """Sample, score, compute advantages, update. Returns the step's metrics."""
    G = config.samples_per_prompt
    t0 = time.perf_counter()
    batch = rollout(parts.engine, parts.tokenizer, rows, config, step)
    t_rollout = time.perf_counter() - t0
    try:
        rewards, components, metrics = score(parts.reward_set, batch, rows, G)
    except RewardError as exc:
        if not exc.skippable:
            raise
        tracker.print(f"[yellow]step {step} skipped: {exc}")
        return {"reward/errors": float(parts.reward_set.errors)}
    metrics.update({"completion_len/mean": batch.completion_lengths.float().mean().item(),
                    "completion/truncated_frac": batch.truncated.float().mean().item(),
                    "time/rollout_s": t_rollout, "tokens_per_s": batch.completion_mask.sum().item() / t_rollout,
                    "train/reused_sampling_forward": float(batch.linear_outputs is not None)})
    if step % config.sample_every == 0 or step == 1:
        tracker.log_samples(step, [{"prompt": batch.prompts[i][-60:], "completion": batch.completions[i],
                                    **{k: v[i].item() for k, v in components.items()}, "reward": rewards[i].item()}
                                   for i in range(0, min(len(batch), config.num_samples * G), G)])
    zero_var = zero_variance_groups(rewards, G)  # (B,)
    metrics["groups/zero_variance_frac"] = zero_var.float().mean().item()
    adv = None
    if parts.value_model is None:  # group advantages need whole groups: compute before any drop
        kwargs = {"scale": config.adv_scale} if config.advantage == "grpo" else {}
        adv = advantages(config.advantage, rewards, G, **kwargs)
    if (config.dynamic_sampling or config.preset.dynamic_sampling) == "drop" and zero_var.any():
        keep = (~zero_var).repeat_interleave(G).nonzero().squeeze(1)
        if len(keep) == 0:
            return {**metrics, "lr": parts.scheduler.get_last_lr()[0]}
        batch, rewards = batch.select(keep), rewards[keep]
        adv = adv[keep] if adv is not None else None
    t1 = time.perf_counter()
    ref_logp = logprobs_no_grad(parts.ref_model, batch, config, dtype) if parts.ref_model is not None else None
    # on-policy single update: pi_old = pi_theta, so old log-probs come free from the training forward (None)
    need_old = config.updates_per_step > 1 or (parts.value_model is not None and ref_logp is not None)
    old_logp = logprobs_no_grad(parts.model, batch, config, dtype) if need_old else None
    returns = old_values = None
    if parts.value_model is not None:
        adv, returns, old_values = ppo_targets(parts.value_model, batch, rewards, ref_logp,
                                               old_logp if old_logp is not None else batch.sampler_logp, config, dtype)
    generator = torch.Generator().manual_seed(config.seed * 7_919 + step)
    stats = update(parts, batch, adv, old_logp, ref_logp, returns, old_values, config, dtype, step, generator)
    metrics.update(stats)
    metrics.update({"time/train_s": time.perf_counter() - t1, "lr": parts.scheduler.get_last_lr()[0],
                    "loss": stats.get("loss/policy", 0.0) + config.vf_coef * stats.get("loss/value", 0.0)})
    return metrics


def setup_models(config: RLConfig):
    model, tokenizer = load_model_and_tokenizer(config.model, config.tokenizer, config.seed, config.model_args)
    ref_model = None
    if config.kl_coef > 0:
        ref_model = load_model(config.model, tokenizer, seed=config.seed, model_args=config.model_args).eval()
        ref_model.requires_grad_(False)
    value_model = None
    if config.advantage == "gae":
        source = model if config.value_init == "policy" else load_model(config.value_init, tokenizer)
        value_model = ValueModel.from_causal_lm(source)
    return model, tokenizer, ref_model, value_model


def evaluate(model, tokenizer, eval_rows, config: RLConfig, dtype) -> tuple[dict[str, float], list[dict]]:
    if not eval_rows or "task" not in eval_rows[0]:
        return {}, []
    metrics, samples = task_accuracy(model, tokenizer, eval_rows, config.max_new_tokens, dtype, num_samples=config.num_samples)
    return {"eval/accuracy": metrics["accuracy"]}, samples


def train(config: RLConfig) -> dict[str, float]:
    """Run online RL end to end; returns the final metrics (with ``initial/eval/accuracy``)."""
    model, tokenizer, ref_model, value_model = setup_models(config)
    reward_set = RewardSet(config.rewards, config.reward_weights or None, config.reward_kwargs, config.on_reward_error)
    rows = load_rows(config.dataset, split="train", limit=config.train_rows, **config.task_args)
    if not rows or "prompt" not in rows[0]:
        raise ValueError(f"Dataset {config.dataset} needs a 'prompt' column; found {sorted(rows[0]) if rows else 'no rows'}.")
    eval_rows = load_rows(config.dataset, split="test", limit=config.eval_rows, **config.task_args) \
        if config.dataset.startswith("task:") else []
    run = common.start_run(config, config.algorithm)
    tracker, dtype = run.tracker, autocast_dtype(config.precision)
    params = [*model.parameters(), *(value_model.parameters() if value_model is not None else [])]
    optimizer = common.build_optimizer(params, config)
    scheduler = common.build_scheduler(optimizer, config, total_steps=config.max_steps * config.updates_per_step)
    engine = HFEngine(model, tokenizer, autocast_dtype=dtype)
    tracker.print(f"{config.algorithm}: {count_parameters(model) / 1e6:.2f}M params, {len(rows)} prompts, "
                  f"{config.prompts_per_step}x{config.samples_per_prompt} completions/step, "
                  f"precision={'bf16 autocast' if dtype else 'fp32'}, run dir {run.dir}")
    initial: dict[str, float] = {}
    if run.checkpoint:
        state = common.restore_checkpoint(run.checkpoint, model, optimizer, scheduler)
        initial = state.get("initial", {})
        if value_model is not None:
            value_model.load_state_dict(state["value_model"])
    else:
        metrics, samples = evaluate(model, tokenizer, eval_rows, config, dtype)
        initial = {f"initial/{k}": v for k, v in metrics.items()}
        tracker.log(0, metrics)
        tracker.log_samples(0, samples, "held-out samples")
    parts = Parts(model, tokenizer, ref_model, value_model, engine, reward_set, optimizer, scheduler)
    try:
        for step in range(run.start_step + 1, config.max_steps + 1):
            batch_rows = [rows[i] for i in common.epoch_batch_indices(len(rows), config.prompts_per_step, step, config.seed)]
            metrics = rl_step(parts, batch_rows, config, dtype, step, tracker)
            if step % config.log_every == 0 or step == config.max_steps or step == 1:
                tracker.log(step, metrics)
            else:
                tracker.advance(step)
            if common.is_due(step, config.eval_every, config.max_steps):
                tracker.log(step, evaluate(model, tokenizer, eval_rows, config, dtype)[0])
            if common.is_due(step, config.save_every, config.max_steps):
                save(run, step, parts, initial, config)
    except common.TrainingDiverged:
        tracker.close()
        raise
    final, samples = evaluate(model, tokenizer, eval_rows, config, dtype)
    tracker.log(config.max_steps, final)
    tracker.log_samples(config.max_steps, samples, "held-out samples")
    save(run, config.max_steps, parts, initial, config)
    final_dir = common.save_final(run, model, tokenizer)
    tracker.close()
    tracker.print(f"Final model: {final_dir}  plots: {run.dir / 'plots'}")
    return {**initial, **final}


def save(run, step: int, parts: Parts, initial: dict, config: RLConfig) -> None:
    state: dict[str, Any] = {"initial": initial}
    if parts.value_model is not None:
        state["value_model"] = parts.value_model.state_dict()
    common.save_checkpoint(run, step, parts.model, parts.tokenizer, parts.optimizer, parts.scheduler, state,
                           config.keep_checkpoints)
