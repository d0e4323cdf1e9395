"""``nproc=2`` through the CLI: kill -9 of one rank stops the whole run (torchrun stops the other rank, the launcher
exits 1 with a message, the newest complete checkpoint stays), and ``resume=true`` continues it to the same weights
as an uninterrupted run (DCP weights and optimizer state, scheduler, each rank's RNG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dist_helpers import GRPO_RUN, max_weight_diff, run_ranks

from lmrl.config import load_config
from lmrl.trainers.rl import trainer as online
from tests.helpers import TINY

TESTS = Path(__file__).resolve().parent
ARGS = [
    *GRPO_RUN,
    "precision=fp32",
    *TINY,
    "max_new_tokens=8",
    "lr=1e-3",
    "max_steps=8",
    "eval_every=0",
    "save_every=1",
    "log_every=1",
    "check_contamination=false",
]


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError):
                pass
    return found


def rank_pids(launcher: int) -> dict[int, int]:
    """rank -> pid of torchrun's worker processes under the launcher (they carry RANK in their environment)."""
    ranks = {}
    for pid in children(launcher):
        try:
            env = dict(v.split("=", 1) for v in (Path(f"/proc/{pid}/environ").read_text().split("\0")) if "=" in v)
        except OSError:
            continue
        if "RANK" in env:
            ranks[int(env["RANK"])] = pid
    return ranks


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # three 2-process runs, 25-36 s: `make test-all` (the default suite stays under 10 minutes)
def test_kill_one_rank_stops_the_run_and_resume_continues_exactly(tmp_path):
    reference = load_config(online.RLConfig, None, [f"output_dir={tmp_path / 'ref'}", *ARGS])
    run_ranks(online.train, reference)

    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parents[1]), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmrl", "rl", f"output_dir={out}", *ARGS, "nproc=2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 180
    while not (out / "checkpoints" / "step-1").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    ranks = rank_pids(proc.pid)
    assert sorted(ranks) == [0, 1], f"no worker ranks found under the launcher: {ranks}"
    os.kill(ranks[1], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stdout + stderr
    assert "a training process failed" in stderr and "resume=true" in stderr
    assert not alive(ranks[0])  # torchrun stopped the surviving rank
    assert not (out / "final").exists()  # it did not run to the end
    done = sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))
    assert done and done[-1] < 8

    resumed = load_config(online.RLConfig, None, [f"output_dir={out}", *ARGS, "resume=true"])
    run_ranks(online.train, resumed)
    assert max_weight_diff(tmp_path / "ref", out) < 1e-6
