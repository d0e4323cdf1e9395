"""Scale-out on one machine: GRPO steps/s with 1 vs 2 learner processes (torchrun, FSDP2 and DDP on gloo), and
with Ray rollout workers, synchronous (async_steps=0) vs one step ahead (async_steps=1).

Every run is the same GRPO job (built-in tiny model, arithmetic prompts, a dense digit-share reward, fp32) started
as ``python -m lmrl rl ...`` in its own subprocess; steps/s is taken from ``metrics.jsonl`` (``time_s`` of every
step) over the steps after ``--warmup``, so start-up (imports, Ray, process groups) is not counted. Nothing is
asserted: this measures the machine as much as the code. On 2 CPU cores the extra processes compete for the same
cores, so do not expect 2 processes to be 2x faster here; on one GPU per process they are (docs/scale.md).

    python benchmarks/scale.py                       # all four set-ups, a Markdown table
    python benchmarks/scale.py --steps 20 --only local-1 ray-async1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

SETUPS = {
    "local-1": ["nproc=1"],
    "fsdp-2": ["nproc=2", "parallel=fsdp"],
    "ddp-2": ["nproc=2", "parallel=ddp"],
    "ray-sync": ["placement=ray", "rollout_workers=2", "async_steps=0"],
    "ray-async1": ["placement=ray", "rollout_workers=2", "async_steps=1"],
}


def digit_share(prompts, completions, **kwargs) -> list[float]:
    """Dense reward: the share of digit characters of each completion (every group has reward variance)."""
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


def run(name: str, args, workdir: Path) -> dict:
    out = workdir / name
    cmd = [
        sys.executable,
        "-m",
        "lmrl",
        "rl",
        f"output_dir={out}",
        "algorithm=grpo",
        f"model={args.model}",
        "precision=fp32",
        "task_args.digits=2",
        "train_rows=512",
        "eval_rows=4",
        f"prompts_per_step={args.prompts}",
        f"samples_per_prompt={args.group}",
        f"max_new_tokens={args.tokens}",
        "rewards=[scale:digit_share]",
        "lr=1e-4",
        f"max_steps={args.steps}",
        "eval_every=0",
        "save_every=0",
        "log_every=1",
        "check_contamination=false",
        "overwrite=true",
        *SETUPS[name],
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time_s"] for r in rows if "reward/mean" in r}
    first, last = args.warmup, max(times)
    steps_per_s = (last - first) / (times[last] - times[first])
    stale = [r.get("rollout/staleness", 0.0) for r in rows if "reward/mean" in r]
    return {
        "setup": name,
        "steps_per_s": steps_per_s,
        "max_staleness": max(stale),
        "reward_first": rows[1]["reward/mean"],
        "reward_last": [r for r in rows if "reward/mean" in r][-1]["reward/mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--prompts", type=int, default=8, help="prompts_per_step (global)")
    parser.add_argument("--group", type=int, default=8, help="samples_per_prompt")
    parser.add_argument("--tokens", type=int, default=16, help="max_new_tokens")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3, help="steps not timed")
    parser.add_argument("--only", nargs="*", choices=list(SETUPS), default=list(SETUPS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [run(name, args, Path(tmp)) for name in args.only]
    base = results[0]["steps_per_s"]
    print(f"| setup | steps/s | vs {results[0]['setup']} | max staleness | reward step 1 -> {args.steps} |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['setup']} | {r['steps_per_s']:.2f} | {r['steps_per_s'] / base:.2f}x | {r['max_staleness']:.0f} | "
            f"{r['reward_first']:.3f} -> {r['reward_last']:.3f} |"
        )


if __name__ == "__main__":
    main()
