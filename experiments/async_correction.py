"""Async GRPO on Ray rollout workers, with and without the train-inference correction, against synchronous.

    python experiments/async_correction.py                       # 3 arms x seeds 0-2, runs in runs/async-correction/
    python experiments/async_correction.py --summary-only        # re-read the run directories
    python experiments/async_correction.py --steps 30 --seeds 0 1 2 --lr 1e-2

Arms (all ``placement=ray rollout_workers=2``; docs/async.md):
- ``sync``:      ``async_steps=0``, every batch sampled with the current weights;
- ``async_tis``: ``async_steps=2`` with the default correction (token-level truncated IS, ``tis_cap=2``);
- ``async_off``: ``async_steps=2 is_mode=off``, the weights logged but not applied (no correction);
- ``async_geo_mask`` (only with ``--arms``): ``async_steps=2`` with a masked geometric-mean weight, rows whose
  geometric mean leaves [1/1.1, 1.1] get weight 0.

Task: the built-in ``task:arithmetic`` (1 digit) with a dense reward, `digit_fraction` below (the share of
completion characters that are digits; a random tiny model starts near 0.1 and learns it in tens of steps), on a
built-in tiny random model (hidden 32, 2 layers), fp32, CPU. Each run is a child ``python -m lmrl rl`` with one
torch thread; a run whose directory has ``final/`` is not run again. The summary reads ``metrics.jsonl``: mean
reward of the first and last 5 steps and of all steps, the first update whose samples average >= 0.9 over 5
steps (counted by the weights that sampled them, so async's lag of up to 2 updates is not held against it), the
staleness, the weights' mean/max and clipped share, the sampler gap; per
arm the mean and min..max over seeds; written to ``<out>/summary.json`` and the console.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from lmrl.report.metric_names import upgrade
from lmrl.tracking import read_jsonl

ARMS = {
    "sync": ["async_steps=0"],
    "async_tis": ["async_steps=2"],
    "async_off": ["async_steps=2", "is_mode=off"],
    "async_geo_mask": ["async_steps=2", "is_level=geometric", "is_mode=mask", "tis_cap=1.1"],
}
DEFAULT_ARMS = ["sync", "async_tis", "async_off"]
BASE = [
    "algorithm=grpo",
    "precision=fp32",
    "model_args.hidden_size=32",
    "model_args.num_hidden_layers=2",
    "model_args.intermediate_size=64",
    "model_args.num_attention_heads=2",
    "dataset=task:arithmetic",
    "task_args.digits=1",
    "train_rows=256",
    "eval_rows=4",
    "prompts_per_step=4",
    "samples_per_prompt=4",
    "max_new_tokens=6",
    "rewards=[async_correction:digit_fraction]",
    "eval_every=0",
    "save_every=0",
    "log_every=1",
    "check_contamination=false",
    "placement=ray",
    "rollout_workers=2",
]


def digit_fraction(prompts, completions, **kwargs):
    """The dense reward of the experiment: the share of completion characters that are digits."""
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


def run(out: Path, arm: str, seed: int, steps: int, lr: float) -> None:
    run_dir = out / f"{arm}-s{seed}"
    if (run_dir / "final").exists():
        return
    command = [
        sys.executable,
        "-m",
        "lmrl",
        "rl",
        *BASE,
        *ARMS[arm],
        f"seed={seed}",
        f"max_steps={steps}",
        f"lr={lr}",
        f"output_dir={run_dir}",
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    print(" ".join(command[1:]), flush=True)
    with open(f"{run_dir}.log", "w") as log:
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)


def mean_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else None


def summarize_run(run_dir: Path) -> dict[str, float | None]:
    rows = [upgrade(r) for r in read_jsonl(run_dir / "metrics.jsonl") if "reward/mean" in r]  # old runs' names too
    rewards = [r["reward/mean"] for r in rows]
    # the weights that sampled step s's batch are those after update s - 1 - staleness (async: up to 2 older)
    versions = [r["step"] - 1 - r.get("rollout/staleness", 0.0) for r in rows]
    reached = [versions[i] for i in range(4, len(rows)) if sum(rewards[i - 4 : i + 1]) / 5 >= 0.9]
    return {
        "reward_first5": sum(rewards[:5]) / 5,
        "reward_last5": sum(rewards[-5:]) / 5,
        "reward_mean": sum(rewards) / len(rewards),
        "update_to_0.9": reached[0] if reached else None,
        "staleness_mean": mean_of(rows, "rollout/staleness_mean"),
        "tis_weight_mean": mean_of(rows, "policy/tis_weight_mean"),
        "tis_weight_max": max((r["policy/tis_weight_max"] for r in rows if "policy/tis_weight_max" in r), default=None),
        "tis_clip_frac": mean_of(rows, "policy/tis_clip_frac"),
        "tis_masked_frac": mean_of(rows, "policy/tis_masked_frac"),
        "sampler_logp_gap": mean_of(rows, "policy/sampler_logp_gap"),
    }


def summarize(out: Path, seeds: list[int]) -> dict:
    summary = {}
    for arm in ARMS:
        per_seed = {s: summarize_run(out / f"{arm}-s{s}") for s in seeds if (out / f"{arm}-s{s}" / "final").exists()}
        if not per_seed:
            continue
        stats = {}
        for key in next(iter(per_seed.values())):
            values = [v[key] for v in per_seed.values() if v[key] is not None]
            if values:
                stats[key] = {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}
        summary[arm] = {"seeds": per_seed, "over_seeds": stats}
        line = "  ".join(f"{k} {v['mean']:.4f} [{v['min']:.4f}..{v['max']:.4f}]" for k, v in stats.items())
        print(f"{arm:10s} n={len(per_seed)}  {line}")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/async-correction"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        for seed in args.seeds:
            for arm in args.arms:
                run(args.out, arm, seed, args.steps, args.lr)
    summarize(args.out, args.seeds)


if __name__ == "__main__":
    main()
