"""Seeded sampling shards (`lmrl.parallel.shards`): distinct streams per shard, shard 0 as a one-process run drew."""

import torch

from lmrl.parallel.shards import rank_shards, shard_generator


def test_each_shard_of_a_step_draws_its_own_stream():
    draws = [torch.rand(4, generator=shard_generator(3, 5, k)).tolist() for k in range(4)]
    assert len({tuple(d) for d in draws}) == 4  # an offset of 2**32 made all four equal (mt19937 keeps 32 bits)
    assert draws[0] == torch.rand(4, generator=torch.Generator().manual_seed(3 * 1_000_003 + 5)).tolist()
    assert draws[1] != torch.rand(4, generator=shard_generator(3, 6, 0)).tolist()  # not the next step's shard 0
    assert draws[2] == torch.rand(4, generator=shard_generator(3, 5, 2)).tolist()  # a pure function: resume-exact


def test_one_process_samples_every_shard_in_order():
    assert rank_shards(list(range(8)), 2) == [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7])]
    assert rank_shards(list(range(8)), 0) == [(0, list(range(8)))]  # 0: one shard per process
