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

from lmrl.algorithms import ADVANTAGES, advantages, overlong_filter, zero_variance_groups
from lmrl.data import packing
from lmrl.models import describe_parameters
from lmrl.models.logprobs import completion_logprobs
from lmrl.models.setup import ModelSetup
from lmrl.models.value import ValueModel
from lmrl.parallel import runtime
from lmrl.rewards import RewardFailure, RewardSet
from lmrl.rollout.protocol import Engine, GroupSampler
from lmrl.rollout.samplers.factory import make_sampler
from lmrl.rollout.tools.section import build_env_factory
from lmrl.rollout.types import RolloutBatch
from lmrl.trainers import agentic, common, loop
from lmrl.trainers.rl.config import ALGORITHMS, Preset, RLConfig  # noqa: F401 - re-exported
from lmrl.trainers.rl.curriculum import Curriculum
from lmrl.trainers.rl.ppo_value import ppo_targets
from lmrl.trainers.rl.prompts import evaluate, load_prompts, longest_prompt, repeat_columns  # noqa: F401 - re-exported
from lmrl.trainers.rl.ptx import PretrainingMix
from lmrl.trainers.rl.refill import refill, round_key
from lmrl.trainers.rl.sampler_gap import check_sampler_gap
from lmrl.trainers.rl.update import Coefficients, Targets, UpdateOptions, update

# ----------------------------------------------------------------------------- rollout and scoring


def score(reward_set: RewardSet, batch: RolloutBatch, rows, group_size: int):
    columns = {**repeat_columns(rows, group_size), **agentic.episode_columns(batch)}
    return reward_set.compute(
        batch.prompts,
        batch.completions,
        truncated=batch.truncated.tolist(),
        completion_lengths=batch.completion_lengths.tolist(),
        **columns,
    )


# ----------------------------------------------------------------------------- learning


@torch.no_grad()
def logprobs_no_grad(model, batch: RolloutBatch, config: RLConfig, dtype) -> torch.Tensor:
    logp = completion_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        batch.prompt_ids.shape[1],
        temperature=config.temperature,
        autocast_dtype=dtype,
        share_prompts=getattr(config, "share_prompts", False),
        chunk_mb=config.logprob_chunk_mb,
    )
    runtime.reshard(model)  # FSDP: a trained policy's root unit must not stay gathered into its training backward
    return logp


def group_advantages(rewards: torch.Tensor, config: RLConfig, trained: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) advantages of this rank's rows, from every rank's rewards (REINFORCE's baseline and adv_scale=batch are
    statistics of the whole batch); with ``trained`` (N,) bool, from the trained rows only (refill's pads get 0)."""
    kwargs = ADVANTAGES.own_options(config.advantage, {"scale": config.adv_scale})
    every, G = runtime.all_gather(rewards), config.samples_per_prompt
    if trained is None:
        adv = advantages(config.advantage, every, G, **kwargs)
    else:
        keep = runtime.all_gather(trained.long()).bool()
        adv = torch.zeros_like(every)
        adv[keep] = advantages(config.advantage, every[keep], G, **kwargs)
    return adv.view(runtime.world(), -1)[runtime.rank()]


def refill_round(parts: Parts, rows: list[dict], config: RLConfig, step: int, k: int, tracker):
    """Refill round ``k`` of ``step``: this rank's ``rows`` sampled and scored, or None (on every rank) when a
    reward failed on some rank."""
    with runtime.full_params(parts.model):
        batch = parts.sampler.sample(rows, round_key(step, k))
    with RewardFailure() as failure:
        rewards = score(parts.reward_set, batch, rows, config.samples_per_prompt)[0]
    if runtime.any_rank(failure.error is not None):
        tracker.print(
            f"[yellow]step {step}: refill round {k} unused, refilling stopped: "
            f"{failure.error or 'a reward function failed on another process'}"
        )
        return None
    return batch, rewards


def drop_groups(batch: RolloutBatch, rewards, adv, dropped: torch.Tensor):
    """DAPO's dynamic sampling: the batch without the ``dropped`` (B,) groups. Several processes: the groups stay
    with their loss mask zeroed, so every rank runs the same forwards; the loss weights count trained rows only."""
    keep = (~dropped).repeat_interleave(batch.group_size)  # (N,) bool
    if runtime.world() > 1:
        return dataclasses.replace(batch, loss_mask=batch.train_mask * keep[:, None].to(batch.train_mask)), rewards, adv
    rows = keep.nonzero().squeeze(1)
    return batch.select(rows), rewards[rows], adv[rows] if adv is not None else None


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class Parts:
    """The live objects of a run that a step uses."""

    model: Any
    tokenizer: Any
    ref_model: Any
    value_model: ValueModel | None
    engine: Engine | None
    """this process's engine (`lmrl.rollout.engines.factory.make_engine`); None with placement=ray"""
    sampler: GroupSampler
    """the step's groups: `LocalGroups` over ``engine``, `ServerAhead` (vLLM servers, async_steps), or `RayRollouts`"""
    reward_set: RewardSet
    optimizer: torch.optim.Optimizer
    scheduler: Any
    env_factory: Any = None
    """multi-turn: makes one environment per trajectory (None: single-turn)"""
    ptx: PretrainingMix | None = None
    """PPO-ptx: the pretraining text of the ptx term and of eval/ptx_ce (None: no ptx_dataset)"""
    options: UpdateOptions | None = None
    """the update's options (`lmrl.trainers.rl.update`), built once from the config"""
    coefs: Coefficients | None = None
    """the loss coefficients that adapt during the run (adaptive KL and entropy); None: the options' own"""
    group_rewards: torch.Tensor | None = None
    """(B,) mean reward of each prompt's group in the last step (None: its rewards failed); the curriculum reads it"""


def rl_step(
    parts: Parts,
    rows: list[dict],
    config: RLConfig,
    dtype,
    step: int,
    tracker,
    more_rows: Callable[[int], list[dict]] | None = None,
) -> dict[str, float]:
    """Sample, score, compute advantages, update. Returns the step's metrics. ``more_rows(k)``: this rank's rows of
    refill round k (dynamic_sampling=refill)."""
    G = config.samples_per_prompt
    t0 = time.perf_counter()
    parts.sampler.sync(parts.model, step - 1)  # the weights after step - 1 updates (resumed: the restored ones)
    with runtime.full_params(parts.model):  # FSDP: each rank samples with the whole policy, no lockstep
        batch = parts.sampler.sample(rows, step)
    t_rollout = time.perf_counter() - t0
    parts.group_rewards = None
    with RewardFailure() as failure:
        rewards, components, metrics = score(parts.reward_set, batch, rows, G)
        parts.group_rewards = rewards.view(-1, G).mean(dim=1)
    if failure.skips(tracker, step):
        return failure.skipped(parts.reward_set.errors)
    metrics.update(
        {
            "completion_len/mean": batch.completion_lengths.float().mean().item(),
            "rollout/truncated_frac": batch.truncated.float().mean().item(),
            "time/rollout_s": t_rollout,
            "tokens_per_s": batch.completion_mask.sum().item() / t_rollout,
            **agentic.episode_metrics(batch),
        }
    )
    metrics.update(parts.sampler.metrics())  # engine=vllm: the weight push; placement=ray: staleness, waiting
    if step % config.sample_every == 0 or step == 1:
        tracker.log_samples(
            step,
            [
                {
                    **agentic.sample_fields(batch, i),
                    **{k: v[i].item() for k, v in components.items()},
                    "reward": rewards[i].item(),
                }
                for i in range(0, min(len(batch), config.num_samples * G), G)
            ],
        )
    zero_var = zero_variance_groups(rewards, G)  # (B,)
    metrics["rollout/zero_variance_frac"] = zero_var.float().mean().item()
    mode, trained = config.dynamic_sampling or config.preset.dynamic_sampling, None
    if mode == "refill":  # zero-variance groups replaced by fresh prompts' groups (lmrl.trainers.rl.refill)
        t_refill = time.perf_counter()
        filled = refill(
            batch,
            rewards,
            lambda k: refill_round(parts, more_rows(k), config, step, k, tracker),
            config.prompts_per_step,
            config.max_refill_batches,
            parts.tokenizer.pad_token_id,
        )
        metrics.update({**filled.metrics(), "time/refill_s": time.perf_counter() - t_refill})
        if filled.batch is None:  # no group of any round on any rank had reward variance
            return {**metrics, "lr": parts.scheduler.get_last_lr()[0]}
        batch, rewards, trained = filled.batch, filled.rewards, filled.trained
    # group advantages need whole groups: compute before any drop
    adv = group_advantages(rewards, config, trained) if parts.value_model is None else None
    if trained is not None and not trained.all():  # several processes: a rank's pads train nothing
        batch = dataclasses.replace(batch, loss_mask=batch.train_mask * trained[:, None].to(batch.train_mask))
    if mode == "drop" and runtime.any_rank(zero_var.any()):
        if not runtime.any_rank((~zero_var).any()):  # every group of every rank dropped
            return {**metrics, "lr": parts.scheduler.get_last_lr()[0]}
        batch, rewards, adv = drop_groups(batch, rewards, adv, zero_var)
    t1 = time.perf_counter()
    ref_logp = logprobs_no_grad(parts.ref_model, batch, config, dtype) if parts.ref_model is not None else None
    # on-policy single update: pi_old = pi_theta, so old log-probs come free from the training forward (None)
    need_old = config.updates_per_step > 1 or (parts.value_model is not None and ref_logp is not None)
    old_logp = logprobs_no_grad(parts.model, batch, config, dtype) if need_old else None
    returns = old_values = None
    coefs, options = parts.coefs, parts.options
    if coefs is not None:
        options = options.with_coefficients(coefs)
    if parts.value_model is not None:
        adv, returns, old_values = ppo_targets(
            parts.value_model,
            batch,
            rewards,
            ref_logp,
            old_logp if old_logp is not None else batch.sampler_logp,
            config,
            dtype,
            kl_coef=coefs.kl_coef if coefs is not None else None,
        )
    if config.mask_truncated:  # after the value targets: GAE needs every row's tokens
        batch = dataclasses.replace(batch, loss_mask=overlong_filter(batch.train_mask, batch.truncated))
    generator = torch.Generator().manual_seed(config.seed * 7_919 + step)
    stats = update(parts, batch, Targets(adv, old_logp, ref_logp, returns, old_values), options, dtype, step, generator)
    metrics.update(stats)
    check_sampler_gap(metrics, config, dtype, step, tracker)  # fp32: a gap far above rounding is a broken sync
    if coefs is not None:
        metrics.update(coefs.advance(stats, len(batch) * runtime.world()))
    metrics.update(
        {
            "time/train_s": time.perf_counter() - t1,
            "lr": parts.scheduler.get_last_lr()[0],
            "loss": stats.get("loss/policy", 0.0) + config.vf_coef * stats.get("loss/value", 0.0),
        }
    )
    return metrics


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
        value_model = setup.value(self.model, config.value_init, self.tokenizer) if config.advantage == "gae" else None
        self.model = setup.distribute(self.model)  # after the value model copied its backbone
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
        )
        self.curriculum = (
            Curriculum(len(self.rows), config.seed, *config.curriculum, config.curriculum_sit_out)
            if config.curriculum is not None
            else None
        )
        ptx = PretrainingMix(config, self.tokenizer) if config.ptx_dataset else None
        self.parts = Parts(
            self.model,
            self.tokenizer,
            ref_model,
            value_model,
            None,  # the engine is the sampler's own
            sampler,
            reward_set,
            self.optimizer,
            self.scheduler,
            env_factory,
            ptx,
            UpdateOptions.from_config(config),
            Coefficients.from_config(config),
        )
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
            config,
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
            f"precision={self.setup.precision_name}, run dir {run.dir}"
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
