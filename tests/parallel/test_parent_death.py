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


# issue 46: a launcher killed while its ranks still imported torch left them as orphans: the death signal was set
# late, and its check compared the parent with itself (the rank had already been re-parented)
LATE_CHILD = (
    "import os, sys, time\ntime.sleep(1.0)  # importing torch: the launcher is killed meanwhile\n"
    "from lmrl.parallel.runtime import die_with_parent\ndie_with_parent()\n"
    "open(sys.argv[1], 'w').write('orphan')\ntime.sleep(30)\n"
)
LAUNCHER = (
    "import os, subprocess, sys\nos.environ['LMRL_LAUNCHER_PID'] = str(os.getpid())\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]])\nprint(child.pid, flush=True)\n"
    "import time\ntime.sleep(120)\n"
)


def test_a_rank_whose_launcher_died_before_it_asked_stops(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    marker = tmp_path / "orphan"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, LATE_CHILD, str(marker)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        child = int(launcher.stdout.readline())
        launcher.kill()  # before the child set its death signal
        launcher.wait()
        assert wait_dead([child], 10) == [] and not marker.exists()
    finally:
        launcher.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_python_m_lmrl_sets_the_death_signal_before_its_imports():
    # a rank started by `nproc=N` whose launcher is not its parent any more stops at once, before importing torch
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LMRL_LAUNCHER_PID": "1"}  # pid 1 is not this child's parent
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "lmrl", "--help"], env=env, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM and time.time() - start < 5 and b"usage" not in proc.stdout


def test_the_launcher_pid_is_not_inherited_by_a_ranks_own_children(monkeypatch):
    from lmrl.parallel.parent import LAUNCHER_ENV, die_with_parent

    monkeypatch.setenv(LAUNCHER_ENV, str(os.getppid()))
    assert die_with_parent(0) and LAUNCHER_ENV not in os.environ  # signal 0: nothing is sent at the parent's death
