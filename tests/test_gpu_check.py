"""`benchmarks/gpu_check.py` (`make gpu-check`) passes on the CPU with its tiny model, importing nothing that a bare
CUDA torch image lacks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CASES = 13

ABSENT_ON_GPU_IMAGE = (
    "datasets",
    "math_verify",
    "latex2sympy2_extended",
    "antlr4",
    "plotly",
    "msgpack",
    "hivemind",
    "mcp",
    "reasoning_gym",
    "lm_eval",
    "playwright",
    "evaluate",
    "dill",
    "multiprocess",
    "pydantic",
    "nltk",
    "trl",
    "vllm",
    "ray",
    "bitsandbytes",
)
"""Modules of lmrl's dependencies and extras that the GPU machines' image does not hold
(/work/.library/device/KINDS.md lists what it holds), plus msgpack, which it holds but these cases do not need.
None in sys.modules makes `import X` raise ImportError and `importlib.util.find_spec(X)` return None."""

RUN = f"""
import runpy, sys
for name in {ABSENT_ON_GPU_IMAGE!r}:
    sys.modules[name] = None
sys.argv = ["benchmarks/gpu_check.py", "--device", "cpu", "--small"]
runpy.run_path("benchmarks/gpu_check.py", run_name="__main__")
"""


@pytest.mark.slow  # ~32 s; `make test-all`, and `make gpu-check` itself ran 13/13 on an H100 (docs/gpu.md)
def test_gpu_check_passes_on_the_cpu_without_the_packages_a_cuda_image_lacks():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", RUN], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    elapsed = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines and lines[-1] == f"gpu-check: {CASES}/{CASES} pass", (
        f"exit {proc.returncode} after {elapsed:.0f} s\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    table = lines[lines.index(next(t for t in lines if t.startswith("case "))) :]
    assert [t.split()[0] for t in table[2:-1]] == [
        "sft",
        "grpo",
        "lora_grpo",
        "dpo",
        "grad_ckpt",
        "chunked_head",
        "unfused",
        "ppo",
        "online_dpo",
        "rejection",
        "reward",
        "avatarl",
        "grpo_unfused",
    ]
