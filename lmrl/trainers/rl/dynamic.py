"""What a step does with groups whose G rewards are all equal (no learning signal): ``dynamic_sampling``'s strategies.

    strategy = DYNAMIC_SAMPLING[mode](config, pad_id)      # once per run
    scored = strategy.fill(scored, draw, metrics)          # before advantages: refill's fresh groups (None: none)
    scored = strategy.drop(scored, zero_var)               # after group advantages: drop's removal (None: all gone)

``off`` and ``count`` keep every group (the share with no variance is logged either way: rollout/zero_variance_frac);
``drop`` removes them after the advantages were computed on whole groups (DAPO, Yu et al. 2025, §3.2, as OpenRLHF's
dynamic filtering); ``refill`` replaces them by groups of the next prompts before the advantages
(`lmrl.trainers.rl.refill`, verl's ``filter_groups``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from lmrl.parallel import runtime
from lmrl.rollout.types import RolloutBatch
from lmrl.trainers.rl.refill import refill


@dataclasses.dataclass
class Scored:
    """A step's scored rows: this rank's batch, rewards (N,), reward components, and which rows train."""

    batch: RolloutBatch
    rewards: torch.Tensor
    components: dict[str, torch.Tensor]
    trained: torch.Tensor | None = None
    """(N,) bool: refill's rows of kept groups (its pads train nothing); None: every row"""
    advantages: torch.Tensor | None = None
    """(N,) outcome advantages of whole groups; None until computed, and for GAE (per token, from a value model)"""


Draw = Callable[[int], tuple[RolloutBatch, torch.Tensor] | None]
"""``draw(k)``: this rank's rows of refill round k sampled and scored, or None on every rank (a reward failed)."""


class KeepGroups:
    """``off`` and ``count``: every group trains."""

    def fill(self, scored: Scored, draw: Draw, metrics: dict[str, float]) -> Scored | None:
        return scored

    def drop(self, scored: Scored, zero_var: torch.Tensor) -> Scored | None:
        return scored


class DropGroups(KeepGroups):
    """``drop``: zero-variance groups train nothing; None when no group of any rank is left."""

    def drop(self, scored: Scored, zero_var: torch.Tensor) -> Scored | None:
        if not runtime.any_rank(zero_var.any()):
            return scored
        if not runtime.any_rank((~zero_var).any()):  # every group of every rank dropped
            return None
        return drop_groups(scored, zero_var)


@dataclasses.dataclass
class RefillGroups(KeepGroups):
    """``refill``: zero-variance groups replaced by fresh prompts' groups, in up to ``max_rounds`` more rounds."""

    want: int
    max_rounds: int
    pad_id: int

    def fill(self, scored: Scored, draw: Draw, metrics: dict[str, float]) -> Scored | None:
        start = time.perf_counter()
        filled = refill(scored.batch, scored.rewards, draw, self.want, self.max_rounds, self.pad_id)
        metrics.update({**filled.metrics(), "time/refill_s": time.perf_counter() - start})
        if filled.batch is None:  # no group of any round on any rank had reward variance
            return None
        batch, trained = filled.batch, filled.trained
        if not trained.all():  # several processes: a rank's pads train nothing
            batch = dataclasses.replace(batch, loss_mask=batch.train_mask * trained[:, None].to(batch.train_mask))
        return Scored(batch, filled.rewards, {}, trained)


def drop_groups(scored: Scored, dropped: torch.Tensor) -> Scored:
    """The rows without the ``dropped`` (B,) groups. Several processes: the groups stay with their loss mask zeroed,
    so every rank runs the same forwards; the loss weights count trained rows only."""
    batch, adv = scored.batch, scored.advantages
    keep = (~dropped).repeat_interleave(batch.group_size)  # (N,) bool
    if runtime.world() > 1:
        masked = dataclasses.replace(batch, loss_mask=batch.train_mask * keep[:, None].to(batch.train_mask))
        return dataclasses.replace(scored, batch=masked)
    rows = keep.nonzero().squeeze(1)
    return Scored(batch.select(rows), scored.rewards[rows], {}, None, adv[rows] if adv is not None else None)


DYNAMIC_SAMPLING: dict[str, Callable[..., KeepGroups]] = {
    "off": lambda config, pad_id: KeepGroups(),
    "count": lambda config, pad_id: KeepGroups(),
    "drop": lambda config, pad_id: DropGroups(),
    "refill": lambda config, pad_id: RefillGroups(config.prompts_per_step, config.max_refill_batches, pad_id),
}
"""Each ``dynamic_sampling`` mode's strategy, from the config and the tokenizer's pad id."""
