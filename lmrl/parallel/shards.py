"""A step's samples drawn in seeded shards, so that they do not depend on how many processes share the batch.

The batch of a step (prompts, or rows a student completes) is cut into ``sampling_shards`` equal contiguous shards
(0: one per process); shard k is sampled with its own generator, seeded by (seed, step, k). Each rank samples the
shards of its own share, so one process with ``sampling_shards=2`` draws exactly what two processes draw, and shard 0
draws what a one-process run with one shard always drew. Used by online RL, online DPO and distillation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmrl.parallel import runtime


def rank_shards(rows: Sequence, sampling_shards: int) -> list[tuple[int, list]]:
    """(step-wide shard index, rows) of each shard of this rank's ``rows`` (its `runtime.shard` of the step)."""
    per_rank = (sampling_shards or runtime.world()) // runtime.world()
    return [(runtime.rank() * per_rank + j, runtime.shard(rows, j, per_rank)) for j in range(per_rank)]


SHARD_STRIDE = 2_654_435_761
"""Seed offset between shards: odd, so shards differ in the low 32 bits, the only ones the CPU generator (mt19937)
uses (an offset of 2**32 gave every shard the same stream)."""


def shard_generator(seed: int, step: int, index: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The generator of shard ``index`` of ``step`` (resume-exact: a pure function of seed, step and shard)."""
    return torch.Generator(device).manual_seed((seed * 1_000_003 + step + index * SHARD_STRIDE) % 2**63)
