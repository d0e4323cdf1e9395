"""A swarm node's settings and a round's data, apart from the model: the nodes' specs, seeds and `lmrl rl`
settings, each round's questions and own rollouts, the held-out rows, the rounds fetched, and the advantages of
ragged question groups. `lmrl.swarm.node` trains on them; the simulation (`lmrl.swarm.sim`) and a joined node
(`lmrl.swarm.cli`) build their nodes from them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any

import torch

from lmrl.algorithms import ADVANTAGES, advantages
from lmrl.data.tasks import Task, get_task, make_rows, split_of
from lmrl.models.forward_plan import ForwardOptions, ForwardPlan
from lmrl.models.loading import is_builtin
from lmrl.parallel import runtime
from lmrl.rollout.types import RolloutBatch
from lmrl.swarm.config import SwarmConfig
from lmrl.trainers.rl.sections import CorrectionSection, MemorySection, UpdateSection, ValueSection
from lmrl.trainers.update import UpdateOptions

_MAX_DRAWS = 1000
"""Redraws of a question until it is not in the held-out (test) split (10% of prompts are)."""


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """What may differ between the nodes of one swarm."""

    name: str
    """Display name; the sim also uses it as the node's peer id."""
    model: str
    model_args: dict
    samples_per_prompt: int
    """G of this node (its peers may use other group sizes)."""
    seed: int
    """Seed of this node's questions, sampling and peer selection (see `node_seed`)."""


def builtin_args(model: str, model_args: dict) -> dict:
    """`model_args` for a built-in model, {} for a model path: a recipe's built-in sizes must not block
    ``model=<path>`` (HF models take their architecture from their config.json)."""
    return dict(model_args) if is_builtin(model) else {}


def node_seed(seed: int, name: str) -> int:
    """A per-node seed in [0, 2**31): sha256 of "seed:name", so nodes of one swarm draw different questions."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "big") >> 1


def node_forward(config: SwarmConfig, dtype, updates: int) -> ForwardOptions:
    """What a node asks of its training forwards: `lmrl rl`'s defaults (shared prompts, the sampling forward replayed
    where the HF engine samples on a CPU) with the swarm's decoding, engine and memory keys."""
    world = runtime.world()
    return ForwardOptions(
        config.temperature,
        dtype,
        config.logprob_chunk_mb,
        replay=None,
        updates_per_step=updates,
        engine=config.engine,
        rollouts_per_step=(config.sampling_shards or world) // world,
        release_memory=config.release_memory,
    )


def node_update(config: SwarmConfig, preset, group_size: int, plan: ForwardPlan) -> UpdateOptions:
    """A node's update: the algorithm's loss with the swarm's clip, aggregation, TIS and epoch keys, no KL."""
    update = UpdateSection(
        ppo_epochs=config.ppo_epochs,
        minibatches=config.minibatches,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        loss_agg=config.loss_agg,
        adv_scale=config.adv_scale,
    )
    return UpdateOptions.from_sections(
        preset,
        update,
        CorrectionSection(tis_cap=config.tis_cap),
        ValueSection(),
        MemorySection(),
        max_len=config.max_new_tokens,
        group_size=group_size,
        grad_accum=config.grad_accum,
        max_grad_norm=config.max_grad_norm,
        plan=plan,
    )


@dataclasses.dataclass
class OwnRound:
    """A node's own rollouts of one round, before training."""

    step: int
    round: int
    rows: list[dict[str, Any]]
    batch: RolloutBatch
    rewards: torch.Tensor | None
    """(B*G,) by this node's verifier; None when the reward function failed this round."""
    metrics: dict[str, float]
    samples: list[dict[str, Any]]


def sample_questions(tasks: dict[str, Task], names: list[str], n: int, seed: int, step: int) -> list[dict[str, Any]]:
    """`n` training questions of round `step`, each from a task drawn uniformly from `names` (with
    replacement: the paper's "specialties sampled with replacement"; a repeated name weighs more).

    A pure function of (seed, step), so a restarted node asks what it would have asked.
    Held-out (test-split) prompts are redrawn."""
    rng = random.Random(f"lmrl-swarm:{seed}:{step}")
    rows = []
    for _ in range(n):
        name = rng.choice(names)
        for _ in range(_MAX_DRAWS):
            ex = tasks[name].sample(rng)
            if split_of(ex.prompt) == "train":
                break
        else:
            raise ValueError(f"task {name!r} drew only held-out prompts in {_MAX_DRAWS} draws; widen its parameters.")
        rows.append({"task": name, "prompt": ex.prompt, "answer": ex.answer, "meta": ex.meta})
    return rows


def group_advantages(name: str, rewards: torch.Tensor, sizes: list[int], scale: str = "group") -> torch.Tensor:
    """Advantages (N,) of consecutive groups of the given sizes, each its own group (ragged GRPO).

    Every group goes through the registry estimator `name` on its own rewards (grpo:
    A_i = (r_i - mean_g r) / (std_g + eps)); a group of one completion gets 0 (no baseline)."""
    if sum(sizes) != rewards.numel():
        raise ValueError(
            f"group_advantages: group sizes {sizes} sum to {sum(sizes)}, not to the {rewards.numel()} rewards given."
        )
    out, start = [], 0
    kwargs = ADVANTAGES.own_options(name, {"scale": scale})
    for size in sizes:
        r = rewards[start : start + size]  # (size,)
        out.append(torch.zeros(size) if size < 2 else advantages(name, r, size, **kwargs))
        start += size
    return torch.cat(out) if out else torch.zeros(0)


def heldout_rows(config: SwarmConfig) -> list[dict[str, Any]]:
    """`eval_rows` test-split questions of each task of the mix (disjoint from every training question)."""
    if config.eval_rows <= 0:
        return []
    rows = []
    for name in dict.fromkeys(config.tasks):
        task = get_task(name, **config.task_args.get(name, {}))
        rows += make_rows(task, config.eval_rows, split="test", seed=config.seed, allow_fewer=True)
    return rows


def fetch_rounds(config: SwarmConfig, round: int) -> list[int]:
    """This round and the `fetch_window` before it (non-negative)."""
    return [r for r in range(round - config.fetch_window, round + 1) if r >= 0]
