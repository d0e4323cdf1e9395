"""Online policy-gradient RL: REINFORCE, REINFORCE++, RLOO, PPO, GRPO, Dr. GRPO, DAPO, GSPO, CISPO.

One loop (RLHF book ch. 6), with parts picked by ``algorithm``:

1. sample ``prompts_per_step`` prompts and ``samples_per_prompt`` completions each (prompt-major);
2. score them with the reward functions (verifiers, user functions), log every component;
3. optionally drop zero-variance groups, or replace them with groups of fresh prompts (DAPO dynamic sampling,
   `lmrl.trainers.rl.refill`);
4. advantages from the registry (``reinforce``, ``reinforce_pp``, ``rloo``, ``grpo``, ``dr_grpo``; PPO: GAE on a
   value model); ``mask_truncated`` then zeroes the loss mask of truncated completions;
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
from collections.abc import Callable
from typing import Any

import torch

from lmrl.algorithms import ADVANTAGES, overlong_filter, zero_variance_groups
from lmrl.data import packing
from lmrl.models import describe_parameters
from lmrl.models.forward_plan import ForwardPlan
from lmrl.models.setup import ModelSetup
from lmrl.models.value import ValueModel
from lmrl.parallel import runtime
from lmrl.rewards import RewardSet
from lmrl.rollout.protocol import GroupSampler
from lmrl.rollout.samplers.factory import make_sampler
from lmrl.rollout.tools.section import build_env_factory
from lmrl.trainers import common, loop
from lmrl.trainers.rl.config import ALGORITHMS, Preset, RLConfig  # noqa: F401 - re-exported
from lmrl.trainers.rl.curriculum import Curriculum
from lmrl.trainers.rl.dynamic import Scored
from lmrl.trainers.rl.prompts import evaluate, load_prompts, longest_prompt
from lmrl.trainers.rl.ptx import PretrainingMix
from lmrl.trainers.rl.stages import (
    RLStepOptions,
    log_samples,
    refill_draw,
    rollout_metrics,
    sample,
    score_step,
    step_generator,
)
from lmrl.trainers.update import Coefficients, UpdateOptions, forward_options, update

# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class RLParts:
    """The live objects of a run that a step uses."""

    model: Any
    tokenizer: Any
    ref_model: Any
    value_model: ValueModel | None
    sampler: GroupSampler
    """the step's groups, with their engine (`lmrl.rollout.samplers.factory.make_sampler`: `LocalGroups`,
    `EpisodeGroups`, `ServerAhead` or `RayRollouts`)"""
    reward_set: RewardSet
    optimizer: torch.optim.Optimizer
    scheduler: Any
    env_factory: Any = None
    """multi-turn: makes one environment per trajectory (None: single-turn)"""
    ptx: PretrainingMix | None = None
    """PPO-ptx: the pretraining text of the ptx term and of eval/ptx_ce (None: no ptx_dataset)"""
    options: UpdateOptions | None = None
    """the update's options (`lmrl.trainers.update`), built once from the config"""
    coefs: Coefficients | None = None
    """the loss coefficients that adapt during the run (adaptive KL and entropy); None: the options' own"""
    group_rewards: torch.Tensor | None = None
    """(B,) mean reward of each prompt's group in the last step (None: its rewards failed); the curriculum reads it"""
    ref_plan: ForwardPlan | None = None
    """the reference model's log-prob forwards (`lmrl.models.forward_plan`); the policy's is ``options.plan``"""


def rl_step(
    parts: RLParts,
    rows: list[dict],
    options: RLStepOptions,
    dtype,
    step: int,
    tracker,
    more_rows: Callable[[int], list[dict]] | None = None,
) -> dict[str, float]:
    """Sample, score, fill or drop groups, advantages, update (`lmrl.trainers.rl.stages`, in cleanrl's order).
    Returns the step's metrics. ``more_rows(k)``: this rank's rows of refill round k (dynamic_sampling=refill)."""
    G, start = options.group_size, time.perf_counter()
    batch = sample(parts, rows, step)
    seconds = time.perf_counter() - start
    scored, metrics = score_step(parts, batch, rows, G, step, tracker)
    if scored is None:  # a reward function failed: the step is skipped (on_reward_error=skip)
        return metrics
    metrics.update({**rollout_metrics(batch, seconds), **parts.sampler.metrics()})  # vLLM: the push; Ray: staleness
    log_samples(tracker, step, scored, options)
    zero_var = zero_variance_groups(scored.rewards, G)  # (B,)
    metrics["rollout/zero_variance_frac"] = zero_var.float().mean().item()
    scored = options.dynamic.fill(scored, refill_draw(parts, more_rows, G, step, tracker), metrics)
    if scored is not None:
        scored.advantages = options.targets.outcome(scored)  # group advantages need whole groups: before any drop
        scored = options.dynamic.drop(scored, zero_var)
    if scored is None:  # no group with reward variance left to train
        return {**metrics, "lr": parts.scheduler.get_last_lr()[0]}
    start = time.perf_counter()
    metrics.update(learn(parts, scored, options, dtype, step, tracker))
    metrics["time/train_s"] = time.perf_counter() - start
    return metrics


def learn(parts: RLParts, scored: Scored, options: RLStepOptions, dtype, step: int, tracker) -> dict[str, float]:
    """Reference and old log-probs, the targets (`lmrl.trainers.rl.targets`), the update; then the sampler-gap alarm
    and the adaptive coefficients."""
    batch, coefs = scored.batch, parts.coefs
    ref_logp = parts.ref_plan.scores(parts.ref_model, batch) if parts.ref_model is not None else None
    # on-policy single update: pi_old = pi_theta, so old log-probs come free from the training forward (None)
    old = options.update.plan.scores(parts.model, batch) if options.targets.needs_old(ref_logp is not None) else None
    targets = options.targets.per_token(parts, scored, ref_logp, old, coefs.kl_coef if coefs else None, dtype)
    if options.mask_truncated:  # after the value targets: GAE needs every row's tokens
        batch = dataclasses.replace(batch, loss_mask=overlong_filter(batch.train_mask, batch.truncated))
    update_options = options.update.with_coefficients(coefs) if coefs is not None else options.update
    stats = update(parts, batch, targets, update_options, dtype, step, step_generator(options.seed, step))
    metrics = dict(stats)
    options.gap.check(metrics, step, tracker)  # fp32: a gap far above rounding is a broken sync
    if coefs is not None:
        metrics.update(coefs.advance(stats, len(batch) * runtime.world()))
    loss = stats.get("loss/policy", 0.0) + options.vf_coef * stats.get("loss/value", 0.0)
    return {**metrics, "lr": parts.scheduler.get_last_lr()[0], "loss": loss}


class OnlineRL(loop.MethodDefaults):
    """The online RL method for `loop.run`: one step samples, scores and updates (`rl_step`). With several
    processes each rank samples and trains on its prompts_per_step/world prompts (whole groups)."""

    data_parallel = True

    def __init__(self, config: RLConfig, setup: ModelSetup):
        self.config, self.setup = config, setup
        reward_set = RewardSet.from_config(config)
        self.rows, self.eval_rows = load_prompts(config)
        self.model, self.tokenizer = setup.policy(distribute=False)
        if config.max_tokens_per_microbatch:  # on the plain model, before FSDP/DDP wrap it
            packing.check_packable(self.model, len(self.tokenizer))
        ref_model = setup.frozen(config.model, self.tokenizer) if config.kl_coef > 0 else None
        needs_value = ADVANTAGES.trait(config.advantage, "value_model", False)  # gae: PPO's value model
        value_model = setup.value(self.model, config.value_init, self.tokenizer) if needs_value else None
        self.model = setup.distribute(self.model)  # after the value model copied its backbone
        forward = forward_options(config, setup.dtype)
        self.plan = ForwardPlan.resolve(self.model, forward, setup.device)
        # several processes: the value model's shards and optimizer state are in the DCP checkpoint beside the policy's
        self.checkpoint_module = (
            torch.nn.ModuleDict({"policy": self.model, "value": value_model}) if value_model is not None else self.model
        )
        params = [*self.model.parameters(), *(value_model.parameters() if value_model is not None else [])]
        self.optimizer = common.build_optimizer(params, config)
        self.scheduler = common.build_scheduler(self.optimizer, config, config.max_steps * config.updates_per_step)
        longest = longest_prompt(self.tokenizer, self.rows, config) if config.engine == "vllm" else 1
        self.env_factory = env_factory = build_env_factory(config, self.tokenizer)
        # local, multi-turn episodes, vLLM servers ahead (async_steps) or Ray workers (`lmrl.rollout.samplers.factory`)
        sampler = make_sampler(
            config,
            self.model,
            self.tokenizer,
            setup.dtype,
            rows_of=self.rows_of,
            env_factory=env_factory,
            longest_prompt=longest,
            recorder=self.plan.recorder,
        )
        self.curriculum = (
            Curriculum(len(self.rows), config.seed, *config.curriculum, config.curriculum_sit_out)
            if config.curriculum is not None
            else None
        )
        ptx = PretrainingMix(config, self.tokenizer) if config.ptx_dataset else None
        self.parts = RLParts(
            self.model,
            self.tokenizer,
            ref_model,
            value_model,
            sampler,
            reward_set,
            self.optimizer,
            self.scheduler,
            env_factory,
            ptx,
            UpdateOptions.from_config(config, self.plan),  # the update's options, built once
            Coefficients.from_config(config),
            ref_plan=ForwardPlan.resolve(ref_model, forward, setup.device) if ref_model is not None else None,
        )
        self.options = RLStepOptions.from_config(config, self.parts.options, setup.dtype, self.tokenizer.pad_token_id)
        self.refilled = 0  # dynamic_sampling=refill: batches of prompts drawn beyond one a step

    def indices_of(self, step: int) -> list[int]:
        """The step's prompt indices in the fixed data order (a pure function of the step, so rollout workers can
        sample ahead); with a curriculum, `step` draws from the curriculum's order instead."""
        config = self.config
        return common.epoch_batch_indices(len(self.rows), config.prompts_per_step, step, config.seed)

    def rows_of(self, step: int) -> list[dict]:
        return [self.rows[i] for i in self.indices_of(step)]

    def step(self, step: int) -> dict[str, float]:
        config, curriculum = self.config, self.curriculum
        at = step + self.refilled  # the data position: refill rounds drew batches of the stream too
        indices = curriculum.next_batch(config.prompts_per_step) if curriculum is not None else self.indices_of(at)
        rows = runtime.shard([self.rows[i] for i in indices])  # this rank's share of the step's prompts
        metrics = rl_step(
            self.parts,
            rows,
            self.options,
            self.setup.dtype,
            step,
            self.tracker,
            lambda k: runtime.shard(self.rows_of(at + k)),
        )
        self.refilled += int(metrics.get("rollout/refill_batches", 0))
        if curriculum is not None:  # one process (refused with several or with placement=ray)
            if self.parts.group_rewards is not None:
                curriculum.record(indices, self.parts.group_rewards.tolist())
            metrics.update(curriculum.metrics())
        return metrics

    def close(self) -> None:
        self.parts.sampler.close()

    def describe(self, run: common.Run) -> str:
        config = self.config
        return (
            f"{config.algorithm}: {describe_parameters(self.model)}, {len(self.rows)} prompts, "
            f"{config.prompts_per_step}x{config.samples_per_prompt} completions/step, "
            f"precision={self.setup.precision_name}, run dir {run.dir}\n{self.plan.describe()}"
        )

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict]]:
        metrics, samples = evaluate(
            self.model, self.tokenizer, self.eval_rows, self.config, self.setup.dtype, self.parts.env_factory
        )
        if self.parts.ptx is not None:  # forgetting of the pretraining distribution
            metrics.update(self.parts.ptx.forgetting(self.model, self.setup.dtype, self.config.logprob_chunk_mb))
        return metrics, samples

    def state_dict(self) -> dict[str, Any]:
        value_model, state = self.parts.value_model, {}
        if value_model is not None and runtime.world() == 1:  # several processes: in the DCP checkpoint
            state["value_model"] = value_model.state_dict()
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        state["coefficients"] = self.parts.coefs.state_dict()
        state["sampler"] = self.parts.sampler.state_dict()  # async_steps: the batches sampled ahead (exact resume)
        state["refill_batches"] = self.refilled
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.parts.value_model is not None and runtime.world() == 1:
            self.parts.value_model.load_state_dict(state["value_model"])
        if self.curriculum is not None:
            self.curriculum.load_state_dict(state["curriculum"])
        if "coefficients" in state:  # checkpoints from before adaptive coefficients: the config's values
            self.parts.coefs.load_state_dict(state["coefficients"])
        self.parts.sampler.load_state_dict(state.get("sampler", {}))
        self.refilled = state.get("refill_batches", 0)


def train(config: RLConfig) -> dict[str, float]:
    """Run online RL end to end; returns the final metrics (with ``initial/eval/accuracy``)."""
    return loop.train(OnlineRL, config, config.algorithm)
