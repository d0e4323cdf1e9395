"""dynamic_sampling=refill on 2 gloo processes trains like one process on the same global batch: every rank runs the
same refill rounds (sampling under FSDP gathers the weights, so a rank that stopped early would hang the other), keeps
the groups one process keeps (ranks with fewer kept groups pad with masked ones) and computes the advantages over the
kept groups of every rank; a 2-process run resumed from a checkpoint after refill rounds ends where it would have."""

from __future__ import annotations

import shutil

import pytest
from dist_helpers import max_weight_diff, run_ranks
from test_data_parallel import DROPS, run, two_like_one

from lmrl.tracking import read_jsonl

REFILL = [*DROPS, "dynamic_sampling=refill"]


@pytest.mark.parametrize(
    "overrides",
    [
        [*REFILL, "adv_scale=batch", "save_every=1"],
        pytest.param([*REFILL, "max_refill_batches=0"], marks=pytest.mark.slow),
    ],
)
def test_refill_rounds_agree_over_ranks_and_train_like_one_process(tmp_path, overrides):
    two_like_one(tmp_path, "grpo", "fsdp", *overrides)
    one, two = (
        [m for m in read_jsonl(tmp_path / name / "metrics.jsonl") if "rollout/refill_kept_frac" in m]
        for name in ("one", "two")
    )
    assert len(one) == len(two) == 3
    for a, b in zip(one, two):
        for key in ("rollout/refill_batches", "rollout/refill_kept_frac", "rollout/refill_filled_frac"):
            assert a[key] == b[key], key
    if "max_refill_batches=0" in overrides:  # drop, with the advantages of the kept groups only
        assert all(m["rollout/refill_batches"] == 0 for m in one) and any(
            m["rollout/refill_filled_frac"] < 1 for m in one
        )
        return
    assert one[0]["rollout/refill_batches"] > 0  # step 1's checkpoint holds a data position ahead of the step
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "two", resumed)
    for gone in ("final", "checkpoints/step-2", "checkpoints/step-3"):
        shutil.rmtree(resumed / gone)
    config, train = run(tmp_path, "grpo", "resumed", "parallel=fsdp", *overrides, "resume=true")
    run_ranks(train, config)
    diff = max_weight_diff(tmp_path / "two", resumed)
    print(f"resumed: max |w_two - w_resumed| = {diff:.2e}")
    assert diff < 1e-6
