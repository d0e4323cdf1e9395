"""Run a trainer on N gloo processes inside a test: forked from the test process (no re-import), each with the
environment torchrun would give it."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import socket
import traceback
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.helpers import digit_fraction, has_digit  # noqa: F401  (rewards=[dist_helpers:digit_fraction])

GRPO_RUN = [
    "algorithm=grpo",
    "task_args.digits=1",
    "train_rows=64",
    "eval_rows=4",
    "prompts_per_step=4",
    "samples_per_prompt=4",
    "rewards=[dist_helpers:digit_fraction]",
]
"""GRPO on 1-digit arithmetic with the dense digit reward: 4 prompts x 4 samples a step, shared by the ranks."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, timeout: float, fn, args) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(timeout, exit=True)  # a hung collective: print every stack and fail
    from lmrl.parallel import runtime

    try:
        fn(*args)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    finally:
        runtime.shutdown()
    os._exit(0)


def run_ranks(fn, *args, world: int = 2, timeout: float = 60) -> None:
    """``fn(*args)`` on ``world`` forked processes joined in one gloo process group; fails if any rank fails."""
    ctx = multiprocessing.get_context("fork")
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, timeout - 10, fn, args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0] * world, f"rank exit codes {codes}"


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    weights = load_file(Path(run_dir) / "final" / "model.safetensors")
    weights.pop("lm_head.weight", None)  # tied to the embeddings (a gathered state dict names both)
    return weights


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)
