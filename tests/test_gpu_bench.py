"""`make gpu-bench` (benchmarks/gpu_bench.py): its CPU dry run times both sides on a tiny Qwen2 model and reports sane
numbers; its time guard stops adding steps; its import check names what a GPU image lacks, before any model is built."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_bench  # noqa: E402 - benchmarks/ is not a package

HAS_TRL = importlib.util.find_spec("trl") is not None
SIDES = ("lmrl", "trl") if HAS_TRL else ("lmrl",)  # trl is in the test extra; without it the lmrl side still runs


def test_the_dry_run_reports_both_sides_with_sane_numbers(tmp_path):
    out = tmp_path / "bench.json"
    bench_args = f"--device cpu --small --peak-tflops 1 --out {out} --frameworks {','.join(SIDES)}"
    cmd = [
        "make",
        "--no-print-directory",
        "gpu-bench",
        f"PYTHON={sys.executable}",
        f"GPU_WHEELS={tmp_path / 'no-wheels'}",  # nothing to install here: the wheels are for a GPU machine
        f"GPU_BENCH_ARGS={bench_args}",
    ]
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600
    )
    elapsed = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[-1] == f"gpu-bench: {len(SIDES)}/{len(SIDES)} sides ran", (
        f"exit {proc.returncode} after {elapsed:.0f} s\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    header = next(i for i, line in enumerate(lines) if line.startswith("model "))
    table = [line.split() for line in lines[header + 2 : header + 2 + len(SIDES)]]
    assert [row[:3] for row in table] == [["small", side, "ok"] for side in SIDES], lines[header:]

    report = json.loads(out.read_text())
    assert report["meta"]["device"] == "CPU" and report["meta"]["versions"]["transformers"]
    args = report["meta"]["settings"]
    rows = args["prompts"] * args["samples"]
    for r in report["results"]:
        assert r["status"] == "ok" and r["steps"] == 3, r  # 1 warm-up + 3 timed steps
        assert r["params"] == gpu_bench.parameters(gpu_bench.SHAPES["small"])
        assert r["s_per_step"] > 0 and math.isclose(r["steps_per_s"] * r["s_per_step"], 1.0)
        assert 0 < r["gen_s_per_step"] < r["s_per_step"], r
        assert 0 < r["completion_len"] <= args["max_new_tokens"], r  # a random model rarely stops early
        assert math.isclose(r["tokens_per_s"], r["completion_len"] * rows / r["s_per_step"], rel_tol=1e-6)
        # 6N per trained token + 2N per sampled token, over the timed seconds
        trained = rows * (r["prompt_len"] + r["completion_len"])
        flops = r["params"] * (6 * trained + 2 * r["completion_len"] * rows)
        assert math.isclose(r["tflops"], flops / r["s_per_step"] / 1e12, rel_tol=1e-6)
        assert 0 < r["mfu"] < 1 and math.isclose(r["mfu"], r["tflops"] / 1.0)  # --peak-tflops 1
        assert r["peak_gib"] is None  # no GPU
        assert 0.2 < r["reward"] < 0.8 and r["loss_finite"], r  # the text hash: uniform in [0, 1)
        assert 0 < r["startup_s"] < r["wall_s"]


def test_the_time_guard_stops_adding_steps_after_the_first_timed_one(tmp_path):
    steps = gpu_bench.Steps(tmp_path / "side.json", total=5, deadline=time.time() + 3600, device="cpu")
    assert [steps.end() for _ in range(4)] == [False, False, False, False]
    assert steps.end() is True  # all 5 done
    late = gpu_bench.Steps(tmp_path / "late.json", total=5, deadline=time.time() - 1, device="cpu")
    assert [late.end(), late.end()] == [False, True]  # the warm-up, then one timed step: never fewer
    late.log(tokens=10.0, gen_s=0.1, reward=0.5, loss=0.0)
    assert json.loads((tmp_path / "late.json").read_text())["tokens"] == [10.0]


def test_the_shapes_are_qwen25s():
    assert round(gpu_bench.parameters(gpu_bench.SHAPES["0.5b"]) / 1e6, 1) == 494.0  # Qwen2.5-0.5B: 494M
    assert round(gpu_bench.parameters(gpu_bench.SHAPES["1.5b"]) / 1e6, 1) == 1543.7  # Qwen2.5-1.5B: 1.54B
    model, _ = gpu_bench.build(gpu_bench.SHAPES["small"], "cpu")
    assert sum(p.numel() for p in model.parameters()) == gpu_bench.parameters(gpu_bench.SHAPES["small"])


CHECK = """
import runpy, sys
sys.modules["datasets"] = None  # as on the GPU image before the wheels
sys.argv = ["benchmarks/gpu_bench.py", "--check-imports", "--device", "cpu"]
sys.path.insert(0, "benchmarks")  # what running the script puts there
runpy.run_path("benchmarks/gpu_bench.py", run_name="__main__")
"""


@pytest.mark.skipif(not HAS_TRL, reason="trl is not installed (the test extra has it)")
def test_the_import_check_names_a_missing_module_and_fails():
    proc = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu-bench imports: missing or wrong: datasets:"), last
