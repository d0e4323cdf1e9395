"""DAPO's dynamic sampling that refills (``dynamic_sampling=refill``): a step's groups whose G rewards are all equal
(no learning signal) are replaced by groups of fresh prompts, until the step has ``prompts_per_step`` groups with
reward variance or ``max_refill_batches`` more batches were sampled.

As verl's ``algorithm.filter_groups`` (``max_num_gen_batches``), OpenRLHF's dynamic filtering and NeMo-RL's dynamic
sampling (DAPO, Yu et al. 2025, §3.2): each refill round draws the next ``prompts_per_step`` prompts of the data
stream (a refilling run moves through its epochs faster), samples and scores them once, and the step keeps the first
groups with reward variance in data order, round after round; the surplus of the last round is discarded (at the next
step it would be off-policy). As in verl the advantages are computed on the kept groups only (``drop`` computes them
on the whole batch first), and ``max_refill_batches=K`` is verl's ``max_num_gen_batches=K+1``. One deviation, on
purpose: at the bound the run goes on and the step trains on the groups it has (``rollout/refill_filled_frac`` < 1; verl
raises).

Several processes: each rank samples and scores its contiguous shard of every round; the zero-variance masks are
gathered, so every rank sees the same global data order, keeps the groups one process would keep and runs the same
number of rounds (sampling under FSDP gathers the weights: every rank must take part in every round). A rank with
fewer kept groups than another pads with its own unkept groups under a zero loss mask, so all ranks run the same
forwards; the losses count trained rows and tokens only (`lmrl.trainers.update`).

Resume: round k of a step samples the prompts at data position ``step + offset + k``, ``offset`` being the refill
batches of the earlier steps (in the checkpoint, `lmrl.trainers.rl.trainer.OnlineRL.state_dict`), with the generators of
(seed, `round_key` (step, k), shard).

    filled = refill(batch, rewards, draw, want=config.prompts_per_step, max_rounds=config.max_refill_batches,
                    pad_id=tokenizer.pad_token_id)   # draw(k) -> (batch, rewards) of round k, or None
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lmrl.algorithms import zero_variance_groups
from lmrl.parallel import runtime
from lmrl.rollout.types import RolloutBatch, concat_batches

ROUND_STRIDE = 2_246_822_519
"""Sampling-key offset between the refill rounds of a step: odd and unlike `lmrl.parallel.shards.SHARD_STRIDE`, so
rounds and shards draw from different streams in the low 32 bits that the CPU generator uses."""


def round_key(step: int, k: int) -> int:
    """The sampling key (the ``step`` of the group sampler's generators) of refill round ``k`` of ``step``."""
    return step + k * ROUND_STRIDE


def accept(zero_var: torch.Tensor, wanted: int) -> torch.Tensor:
    """Bool (B,): the first ``wanted`` groups, in order, whose rewards vary (``zero_var`` False)."""
    varied = ~zero_var
    return varied & (varied.cumsum(0) <= wanted)


@dataclass
class Filled:
    """A step's batch after refilling: this rank's kept groups (data order), then its masked pads."""

    batch: RolloutBatch | None
    """(N, ...) this rank's rows; None when no rank kept a group (the step has nothing to train)"""
    rewards: torch.Tensor | None
    """(N,) their rewards, computed once when their round was scored"""
    trained: torch.Tensor | None
    """(N,) bool: rows of kept groups (False on pads)"""
    rounds: int
    """refill batches sampled (0 .. max_refill_batches)"""
    sampled: int
    """groups sampled over every rank and round"""
    kept: int
    """groups kept over every rank (at most prompts_per_step)"""
    want: int

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/refill_batches": float(self.rounds),
            "rollout/refill_kept_frac": self.kept / self.sampled,
            "rollout/refill_filled_frac": self.kept / self.want,
        }


def refill(
    batch: RolloutBatch,
    rewards: torch.Tensor,
    draw: Callable[[int], tuple[RolloutBatch, torch.Tensor] | None],
    want: int,
    max_rounds: int,
    pad_id: int,
) -> Filled:
    """Keep ``batch``'s groups with reward variance and add those of rounds ``draw(1)``, ``draw(2)``, ... until
    ``want`` groups over every rank are kept or ``max_rounds`` rounds were drawn. ``draw(k)`` samples and scores
    this rank's shard of round k; it returns None on every rank when a round's rewards failed (refilling stops)."""
    G = batch.group_size
    rounds, masks, kept, sampled = [(batch, rewards)], [], 0, 0
    while True:
        every = runtime.all_gather(zero_variance_groups(rounds[-1][1], G).long()).bool()  # (B,) data order
        taken = accept(every, want - kept)
        kept, sampled = kept + int(taken.sum()), sampled + len(every)
        masks.append(taken.view(runtime.world(), -1)[runtime.rank()])  # this rank's groups of the round
        if kept >= want or len(rounds) > max_rounds:
            break
        nxt = draw(len(rounds))
        if nxt is None:
            break
        rounds.append(nxt)
    if kept == 0:
        return Filled(None, None, None, len(rounds) - 1, sampled, 0, want)
    mine = sum(int(m.sum()) for m in masks)
    pads = int(runtime.all_max(float(mine))) - mine  # several processes: as many groups on every rank
    parts, pad_parts = [], []
    for (b, r), m in zip(rounds, masks):
        if m.any():
            parts.append((b.select_groups(m), r.view(-1, G)[m].reshape(-1)))
        unkept = (~m).nonzero().squeeze(1)[: pads - sum(len(p[1]) // G for p in pad_parts)]
        if len(unkept):
            pad_parts.append((b.select_groups(unkept), r.view(-1, G)[unkept].reshape(-1)))
    both = parts + pad_parts
    out = concat_batches([b for b, _ in both], pad_id)
    trained = torch.cat([torch.full((len(r),), i < len(parts)) for i, (_, r) in enumerate(both)])
    return Filled(out, torch.cat([r for _, r in both]), trained, len(rounds) - 1, sampled, kept, want)
