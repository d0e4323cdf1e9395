"""The stages of an online RL step (`lmrl.trainers.rl.trainer.rl_step` calls them in cleanrl's order), and their
options, chosen once per run (`RLStepOptions.from_config`): sample, score, observe, fill or drop groups
(`lmrl.trainers.rl.dynamic`), targets (`lmrl.trainers.rl.targets`), update (`lmrl.trainers.update`)."""

from __future__ import annotations

import dataclasses

import torch

from lmrl.parallel import runtime
from lmrl.rewards import RewardFailure, RewardSet
from lmrl.rollout.types import RolloutBatch
from lmrl.trainers import agentic
from lmrl.trainers.rl.dynamic import DYNAMIC_SAMPLING, KeepGroups, Scored
from lmrl.trainers.rl.prompts import repeat_columns
from lmrl.trainers.rl.refill import round_key
from lmrl.trainers.rl.sampler_gap import SamplerGapAlarm
from lmrl.trainers.rl.targets import OutcomeTargets, make_targets
from lmrl.trainers.update import UpdateOptions


@dataclasses.dataclass(frozen=True)
class RLStepOptions:
    """What a step reads, built once from the config."""

    update: UpdateOptions
    dynamic: KeepGroups
    targets: OutcomeTargets
    gap: SamplerGapAlarm
    group_size: int
    seed: int = 0
    sample_every: int = 1
    num_samples: int = 1
    mask_truncated: bool = False
    vf_coef: float = 0.0

    @classmethod
    def from_config(cls, config, update: UpdateOptions, dtype, pad_id: int) -> RLStepOptions:
        mode = config.dynamic_sampling or config.preset.dynamic_sampling
        return cls(
            update,
            DYNAMIC_SAMPLING[mode](config, pad_id),
            make_targets(config),
            SamplerGapAlarm.from_config(config, dtype),
            config.samples_per_prompt,
            config.seed,
            config.sample_every,
            config.num_samples,
            config.mask_truncated,
            config.vf_coef,
        )


def score(reward_set: RewardSet, batch: RolloutBatch, rows, group_size: int):
    """Every reward function on the batch's completions: (rewards (N,), components, metrics)."""
    columns = {**repeat_columns(rows, group_size), **agentic.episode_columns(batch)}
    return reward_set.compute(
        batch.prompts,
        batch.completions,
        truncated=batch.truncated.tolist(),
        completion_lengths=batch.completion_lengths.tolist(),
        **columns,
    )


def sample(parts, rows: list[dict], step: int) -> RolloutBatch:
    """This rank's rows, G completions each, sampled with the weights after ``step - 1`` updates."""
    parts.sampler.sync(parts.model, step - 1)  # resumed: the restored weights
    with runtime.full_params(parts.model):  # FSDP: each rank samples with the whole policy, no lockstep
        return parts.sampler.sample(rows, step)


def score_step(parts, batch: RolloutBatch, rows, group_size: int, step: int, tracker):
    """(Scored, metrics), or (None, the skipped step's metrics) when a reward function failed (``on_reward_error``);
    records each group's mean reward for the curriculum (``parts.group_rewards``; None on failure)."""
    parts.group_rewards = None
    with RewardFailure() as failure:
        rewards, components, metrics = score(parts.reward_set, batch, rows, group_size)
        parts.group_rewards = rewards.view(-1, group_size).mean(dim=1)
    if failure.skips(tracker, step):
        return None, failure.skipped(parts.reward_set.errors)
    return Scored(batch, rewards, components), metrics


def rollout_metrics(batch: RolloutBatch, seconds: float) -> dict[str, float]:
    return {
        "completion_len/mean": batch.completion_lengths.float().mean().item(),
        "rollout/truncated_frac": batch.truncated.float().mean().item(),
        "time/rollout_s": seconds,
        "tokens_per_s": batch.completion_mask.sum().item() / seconds,
        **agentic.episode_metrics(batch),
    }


def log_samples(tracker, step: int, scored: Scored, options: RLStepOptions) -> None:
    """The first completion of the first ``num_samples`` groups, with every reward component, every
    ``sample_every`` steps (and at step 1)."""
    if step % options.sample_every and step != 1:
        return
    G, batch = options.group_size, scored.batch
    rows = range(0, min(len(batch), options.num_samples * G), G)
    tracker.log_samples(
        step,
        [
            {
                **agentic.sample_fields(batch, i),
                **{k: v[i].item() for k, v in scored.components.items()},
                "reward": scored.rewards[i].item(),
            }
            for i in rows
        ],
    )


def refill_draw(parts, more_rows, group_size: int, step: int, tracker):
    """``draw(k)`` for refill round ``k`` of ``step``: this rank's ``more_rows(k)`` sampled and scored, or None (on
    every rank) when a reward failed on some rank."""

    def draw(k: int):
        rows = more_rows(k)
        with runtime.full_params(parts.model):
            batch = parts.sampler.sample(rows, round_key(step, k))
        with RewardFailure() as failure:
            rewards = score(parts.reward_set, batch, rows, group_size)[0]
        if runtime.any_rank(failure.error is not None):
            tracker.print(
                f"[yellow]step {step}: refill round {k} unused, refilling stopped: "
                f"{failure.error or 'a reward function failed on another process'}"
            )
            return None
        return batch, rewards

    return draw


def step_generator(seed: int, step: int) -> torch.Generator:
    """The update's minibatch order of ``step``: a pure function of the seed and the step (exact resume)."""
    return torch.Generator().manual_seed(seed * 7_919 + step)
