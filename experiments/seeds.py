"""One lmrl command over several seeds, then every held-out metric's start, end and change: mean and spread.

    python experiments/seeds.py demo                                             # seeds 0-4 of `lmrl demo`
    python experiments/seeds.py selfplay --config selfplay/tiny_arithmetic
    python experiments/seeds.py dpo --config dpo/online_tiny_prefs --set model=runs/sft-tiny-prefs/final
    python experiments/seeds.py demo --summary-only                              # re-read the run directories
    python experiments/seeds.py distill --set model=runs/kd/distill-s{seed}/final   # {seed}: per-seed paths

Seed s runs ``lmrl <verb> [--config RECIPE] seed=s output_dir=<out>/<verb>-s<s> <--set ...>`` in a child process
with one torch thread (``OMP_NUM_THREADS=1``); a seed whose run directory already has ``final/`` (or, for the
two-stage demo, ``rl/final/``) is not run again. The summary reads each run's ``metrics.jsonl`` (the demo's
``sft/`` and ``rl/`` stages in turn): for every ``eval/`` metric, the first value, the last, and the change, per
seed and as mean, sample standard deviation and min..max; it goes to ``<out>/<verb>-summary.json`` and the console.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from lmrl.tracking import read_jsonl


def run_dir(out: Path, verb: str, seed: int) -> Path:
    return out / f"{verb}-s{seed}"


def metric_files(run: Path) -> list[Path]:
    """A run's metrics.jsonl, or its stages' in order (`lmrl demo`: sft, then rl)."""
    if (run / "metrics.jsonl").exists():
        return [run / "metrics.jsonl"]
    return [run / stage / "metrics.jsonl" for stage in ("sft", "rl") if (run / stage / "metrics.jsonl").exists()]


def eval_points(run: Path) -> dict[str, list[float]]:
    """Every ``eval/`` metric of a run, in logging order (stage by stage), keyed ``<stage>/<metric>`` for stages."""
    files = metric_files(run)
    if not files:
        raise FileNotFoundError(f"{run} has no metrics.jsonl: the run did not start (see {run}.log).")
    points: dict[str, list[float]] = {}
    for path in files:
        prefix = "" if path.parent == run else f"{path.parent.name}/"
        for record in read_jsonl(path):
            for key, value in record.items():
                if key.startswith("eval/") and isinstance(value, (int, float)):
                    points.setdefault(prefix + key, []).append(float(value))
    return points


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def summarize(runs: dict[int, Path]) -> dict[str, dict]:
    """metric -> {"start", "end", "change"}: per seed values and their spread (metrics every seed logged)."""
    points = {seed: eval_points(run) for seed, run in runs.items()}
    keys = sorted(set.intersection(*(set(p) for p in points.values())))
    summary = {}
    for key in keys:
        start = [points[s][key][0] for s in runs]
        end = [points[s][key][-1] for s in runs]
        change = [b - a for a, b in zip(start, end)]
        summary[key] = {
            name: {"values": v, **spread(v)} for name, v in (("start", start), ("end", end), ("change", change))
        }
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("verb", help="an lmrl verb: demo, rl, sft, dpo, selfplay, distill, ...")
    parser.add_argument("--config", help="its recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more overrides for every seed; {seed} in a value is replaced by the seed",
    )
    parser.add_argument("--out", default="runs/seeds", help="parent of the run directories")
    parser.add_argument("--summary-only", action="store_true", help="only summarise the existing run directories")
    args = parser.parse_args(argv)
    out = Path(args.out)
    runs = {seed: run_dir(out, args.verb, seed) for seed in args.seeds}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for seed, run in runs.items():
        if args.summary_only or (run / "final").exists() or (run / "rl" / "final").exists():
            continue
        command = [
            sys.executable,
            "-m",
            "lmrl",
            args.verb,
            *(["--config", args.config] if args.config else []),
            f"seed={seed}",
            f"output_dir={run}",
            *(value.replace("{seed}", str(seed)) for value in args.set),
        ]
        print("running:", " ".join(command[2:]), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        with open(f"{run}.log", "w") as log:
            subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    summary = summarize(runs)
    command = " ".join(
        [
            "python experiments/seeds.py",
            args.verb,
            *(["--config", args.config] if args.config else []),
            "--seeds",
            *map(str, args.seeds),
            *(["--set", *args.set] if args.set else []),
        ]
    )
    path = out / f"{args.verb}-summary.json"
    path.write_text(json.dumps({"command": command, "seeds": args.seeds, "metrics": summary}, indent=1))
    print(f"{command}\n{'metric':34s} {'start':>20s} {'end':>20s} {'change (min..max)':>30s}")
    for key, s in summary.items():
        cells = [f"{s[n]['mean']:.3f} ± {s[n]['std']:.3f}" for n in ("start", "end", "change")]
        print(
            f"{key:34s} {cells[0]:>20s} {cells[1]:>20s} {cells[2]:>16s} "
            f"({s['change']['min']:+.3f}..{s['change']['max']:+.3f})"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
