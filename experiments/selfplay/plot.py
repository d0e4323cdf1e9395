"""Summarise runs of `lmrl selfplay --config selfplay/tiny_arithmetic` into results.json and a 4-panel plot.

    python experiments/selfplay/plot.py RUN_DIR [RUN_DIR ...] [--out experiments/selfplay]

Per run: held-out Solver accuracy and answer probability before/after self-play (step 0 and the last
step of metrics.jsonl), and the Challenger's pass rate, malformed share and diversity averaged over the
first and the last fifth of the self-play steps. The plot shows every run's curves over the steps (6 panels).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from lmrl.report.metric_names import upgrade
from lmrl.tracking import read_jsonl

EVAL_KEYS = ("eval/accuracy", "eval/answer_prob")
WATCH_KEYS = (
    "challenger/pass_rate",
    "challenger/malformed_frac",
    "challenger/distinct_frac",
    "challenger/distinct_3gram_frac",
    "challenger/operands_mean",
    "reward/mean",
    "kl",
    "challenger/kl",
)
PANELS = (
    ("held-out Solver (greedy accuracy, answer prob.)", EVAL_KEYS),
    ("Challenger difficulty: Solver pass rate on its queries", ("challenger/pass_rate",)),
    ("malformed queries (share)", ("challenger/malformed_frac",)),
    (
        "query diversity (distinct / N, distinct 3-grams)",
        ("challenger/distinct_frac", "challenger/distinct_3gram_frac"),
    ),
    ("query difficulty: mean operands of valid queries", ("challenger/operands_mean",)),
    ("per-token KL to the reference (Solver, Challenger)", ("kl", "challenger/kl")),
)


def curve(records: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) of every record holding ``key``."""
    return [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]


def window_mean(points: list[tuple[int, float]], lo: float, hi: float) -> float | None:
    """Mean of the values logged at steps in (lo, hi]."""
    values = [v for s, v in points if lo < s <= hi]
    return statistics.fmean(values) if values else None


def summarise(run: Path) -> dict:
    records = [upgrade(r) for r in read_jsonl(run / "metrics.jsonl")]  # a run written before the namespaces too
    last = max(r["step"] for r in records)
    out: dict = {"steps": last}
    for key in EVAL_KEYS:
        points = curve(records, key)
        out[key] = {"before": points[0][1], "after": points[-1][1], "curve": points}
    fifth = last / 5
    for key in WATCH_KEYS:
        points = curve(records, key)
        if points:
            out[key] = {
                "first_fifth": window_mean(points, 0, fifth),
                "last_fifth": window_mean(points, last - fifth, last),
            }
    return out


def plot(results: dict[str, dict], runs: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    styles = ("-", "--", ":", "-.")
    for ax, (title, keys) in zip(axes.flat, PANELS):
        for i, (name, records) in enumerate(runs.items()):
            for j, key in enumerate(keys):
                points = curve(records, key)
                if points:
                    steps, values = zip(*points)
                    ax.plot(steps, values, styles[j % len(styles)], color=f"C{i}", label=f"{name} {key}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("self-play step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    runs = {run.name: [upgrade(r) for r in read_jsonl(run / "metrics.jsonl")] for run in args.runs}
    results = {run.name: summarise(run) for run in args.runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, runs, args.out / "selfplay_tiny_arithmetic.png")
    for name, r in results.items():
        acc, prob = r["eval/accuracy"], r["eval/answer_prob"]
        watch = "  ".join(
            f"{k} {r[k]['first_fifth']:.3f}->{r[k]['last_fifth']:.3f}"
            for k in WATCH_KEYS
            if k in r and r[k]["first_fifth"] is not None
        )
        print(
            f"{name}: accuracy {acc['before']:.3f}->{acc['after']:.3f}  answer_prob {prob['before']:.4f}->"
            f"{prob['after']:.4f}  {watch}"
        )


if __name__ == "__main__":
    main()
