"""`benchmarks/grpo_vs_trl.py` measures what it says: its lmrl child's memory model sees every phase of a step (the
rollout, the training forward and backward, the optimizer), so a refactor that moves what it instruments fails here
instead of printing `nan` in docs/benchmarks.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~25-40 s: a real GRPO child process on builtin:medium
def test_the_lmrl_memory_model_sees_the_forward_backward_and_optimizer():
    cmd = [
        sys.executable,
        "benchmarks/grpo_vs_trl.py",
        "--model",
        "builtin:tiny",
        "--prompts",
        "2",
        "--samples",
        "2",
        "--max-new-tokens",
        "4",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--frameworks",
        "lmrl",
        "--threads",
        "1",
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    phases = re.search(r"phase peaks: (.*)", out).group(1)
    assert all(f"{phase} " in phases for phase in ("rollout", "forward", "backward", "optimizer")), phases
    backward = re.search(r"model of the backward peak \(sum\)\s+(\d+)\s+measured\s+(\S+)", out)
    assert backward and backward.group(2) != "nan", out[-2000:]
    assert "saved for backward: activations" in out and "gradients (fp32)" in out
