"""One run at a time in a run directory (`lmrl.trainers.runlock`), a resume only of a run of the same method, and
``~`` in config paths (issue 33, item 1)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_sft import TINY, sft_main, start_failing_at_the_first_step

from lmrl import cli
from lmrl.config import from_dict
from lmrl.trainers import runlock
from lmrl.trainers.sft import trainer as sft

ROOT = Path(__file__).resolve().parents[2]
HOLDER = (
    "import sys, time\nfrom lmrl.trainers import runlock\nrunlock.acquire(sys.argv[1])\n"
    "print('locked', flush=True)\ntime.sleep(120)\n"
)


def out_text(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())  # rich wraps long lines


@pytest.fixture
def holder(tmp_path):
    """Another process holding ``tmp_path/run``'s lock, as a run in progress does."""
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield run, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_run_in_a_directory_in_use_is_refused_naming_it_and_its_owner(holder, capsys):
    run, proc = holder
    assert sft_main(run, "max_steps=1") == 2  # main: both runs exit 0, their metrics.jsonl interleaved
    out = out_text(capsys)
    assert f"'{run}' is in use by another lmrl run (pid {proc.pid} on host" in out and "Traceback" not in out
    assert sorted(p.name for p in run.iterdir()) == [runlock.LOCK_FILE]  # nothing written
    proc.kill()
    proc.wait()  # the holder dies without releasing: its lock is stale
    assert sft_main(run, "max_steps=1") == 0
    assert f"taking over the lock of a run that is gone (pid {proc.pid}" in out_text(capsys)
    assert not (run / runlock.LOCK_FILE).exists()  # released at the end of the run


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / runlock.LOCK_FILE).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    notices = []
    lock = runlock.acquire(tmp_path, notice=notices.append)
    assert len(notices) == 1 and f"pid {dead.pid}" in notices[0]
    assert json.loads((tmp_path / runlock.LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / runlock.LOCK_FILE).exists()


def test_a_lock_of_a_run_on_another_host_is_refused_with_the_file_to_delete(tmp_path):
    (tmp_path / runlock.LOCK_FILE).write_text(json.dumps({"pid": 1234, "host": "gpu-node-7"}))
    with pytest.raises(runlock.RunDirInUse, match="another host.*gpu-node-7.*delete"):
        runlock.acquire(tmp_path)


def test_a_live_pid_in_the_lock_file_is_refused_even_when_the_file_is_not_locked(tmp_path):
    """A filesystem whose locks do not reach other processes: the owner record alone guards the directory."""
    (tmp_path / runlock.LOCK_FILE).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    with pytest.raises(runlock.RunDirInUse, match=f"pid {os.getppid()}"):
        runlock.acquire(tmp_path)


def test_the_lock_is_released_when_a_run_fails(tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert start_failing_at_the_first_step(run, monkeypatch) == 2
    assert not (run / runlock.LOCK_FILE).exists() and not runlock.HELD
    assert sft_main(run, "max_steps=1") == 0


def test_resume_refuses_a_run_of_another_verb(tmp_path, capsys):
    run = tmp_path / "run"
    assert sft_main(run, "max_steps=1") == 0
    before = (run / "config.yaml").read_text()
    args = [
        "rl",
        f"output_dir={run}",
        *[a for a in TINY if not a.startswith("batch_size")],
        "prompts_per_step=2",
        "samples_per_prompt=2",
        "max_new_tokens=4",
        "max_steps=2",
        "resume=true",
    ]
    assert cli.main(args) == 2  # main: GRPO continued from the SFT checkpoint, exit 0
    out = out_text(capsys)
    assert "holds a run of `lmrl sft`, and this is `lmrl rl algorithm=grpo`" in out and "Traceback" not in out
    assert (run / "config.yaml").read_text() == before and yaml.safe_load(before)["max_steps"] == 1
    assert not (run / runlock.LOCK_FILE).exists()


def test_a_tilde_in_a_path_key_is_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = from_dict(sft.SFTConfig, {"output_dir": "~/runs/x", "dataset": "~/data.jsonl", "system_prompt": "~/hi"})
    assert config.output_dir == str(tmp_path / "runs" / "x")  # main: a folder named "~" in the working directory
    assert config.dataset == str(tmp_path / "data.jsonl")
    assert config.system_prompt == "~/hi"  # text, not a path
    assert sft.SFTConfig(output_dir="~/y").output_dir == str(tmp_path / "y")  # configs built in Python too


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder", "dangling symlink"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_naming_it(tmp_path, kind):
    # issue 46: a symlink named lmrl.lock truncated and overwrote its target (exit 0); a FIFO or folder: a traceback
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    run.mkdir()
    victim.write_text("keep")
    lock = run / runlock.LOCK_FILE
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "dangling symlink":
        lock.symlink_to(tmp_path / "created-through-the-link")
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    with pytest.raises(runlock.BadLockFile, match="not the regular lock file") as err:
        runlock.acquire(run)
    message = str(err.value)
    assert str(lock) in message and f"Delete {lock}" in message
    assert {"symlink": "symbolic link", "dangling symlink": "symbolic link", "fifo": "FIFO", "folder": "folder"}[
        kind
    ] in message
    assert victim.read_text() == "keep" and not (tmp_path / "created-through-the-link").exists()
    assert isinstance(err.value, FileExistsError)  # the CLI prints it as one `error:` line (exit 2)


def test_a_run_into_a_symlinked_lock_is_one_error_line_and_the_target_is_kept(tmp_path, capsys):
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    run.mkdir()
    victim.write_text("keep")
    (run / runlock.LOCK_FILE).symlink_to(victim)
    assert sft_main(run, "max_steps=1") == 2
    out = out_text(capsys)
    assert "is a symbolic link" in out and "Traceback" not in out and victim.read_text() == "keep"
