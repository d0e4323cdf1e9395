"""A rank dies with its launcher (``PR_SET_PDEATHSIG``, `lmrl.parallel.runtime.die_with_parent`): killing the
torchrun parent of an ``nproc=2`` run leaves no rank training as an orphan (issue 33)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_kill_resume import ARGS, TESTS, alive, rank_pids

ROOT = TESTS.parents[1]
CHILD = (
    "import time\nfrom lmrl.parallel.runtime import die_with_parent\nassert die_with_parent()\n"
    "print('ready', flush=True)\ntime.sleep(120)\n"
)
PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE, text=True)\n"
    "print(child.pid, flush=True)\nprint(child.stdout.readline().strip(), flush=True)\ntime.sleep(120)\n"
)


def wait_dead(pids: list[int], seconds: float) -> list[int]:
    """The pids of ``pids`` still alive after up to ``seconds``."""
    deadline = time.time() + seconds
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_a_process_that_asked_dies_with_its_parent():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True, env=env)
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "ready"
        parent.kill()  # SIGKILL: the parent cannot clean up; only the kernel's death signal reaches the child
        parent.wait()
        assert wait_dead([child], 10) == []
    finally:
        parent.kill()


@pytest.mark.slow  # ~30-60 s on 2 cores: torchrun starts two ranks that load a model and train a step
def test_killing_the_launcher_of_an_nproc_2_run_stops_its_ranks(tmp_path: Path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmrl", "rl", f"output_dir={out}", *ARGS, "max_steps=200", "nproc=2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 180
        while not (out / "checkpoints" / "step-1").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        ranks = rank_pids(proc.pid)
        assert sorted(ranks) == [0, 1], f"no worker ranks found under the launcher: {ranks}"
        os.kill(proc.pid, signal.SIGKILL)  # main: both ranks trained on as orphans
        proc.wait()
        assert wait_dead(list(ranks.values()), 20) == []
    finally:
        proc.kill()
        for pid in rank_pids(proc.pid).values():
            os.kill(pid, signal.SIGKILL)
