"""Summarise the avatarl experiment's run directories into results.json and avatarl_vs_ce.png.

python experiments/avatarl/plot.py [runs/avatarl-experiment] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from lmrl.report.metric_names import upgrade
from lmrl.tracking import read_jsonl

OBJECTIVES = ("ce", "avatarl")
COLORS = {"ce": "tab:blue", "avatarl": "tab:red"}
REWARD_KEYS = (
    "avatarl/expected_reward",
    "avatarl/gold_reward",
    "avatarl/reward_mean",
    "avatarl/rewarded_per_position",
    "avatarl/active_size",
    "avatarl/entropy",
    "loss/ce",
)


def metrics(path: Path) -> list[dict]:
    """A run's metrics.jsonl under the current metric names (also a run written before them)."""
    return [upgrade(r) for r in read_jsonl(path)]


def curve(records: list[dict], key: str) -> list[tuple[int, float]]:
    """(tokens, value) of every record holding ``key``; the step-0 evaluation has 0 tokens."""
    return [(r.get("time/tokens", 0), r[key]) for r in records if isinstance(r.get(key), (int, float))]


def mean_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Pointwise mean over seeds (all runs evaluate at the same token counts)."""
    xs = [x for x, _ in curves[0]]
    if any([x for x, _ in c] != xs for c in curves):
        raise ValueError("runs were evaluated at different token counts; use the same recipe for every seed.")
    return [(x, statistics.fmean(c[i][1] for c in curves)) for i, x in enumerate(xs)]


def tokens_to_reach(points: list[tuple[int, float]], target: float) -> float | None:
    """First token count where a (linearly interpolated) decreasing curve reaches ``target``; None if never."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y1 <= target:
            return x1 if y0 == y1 else x0 + (y0 - target) / (y0 - y1) * (x1 - x0)
    return None


def final_model_stats(run_dirs: list[Path]) -> dict[str, dict[str, float]]:
    """val/ce and val/entropy of each run's final/ model on its validation windows (recomputed, fp32)."""
    from lmrl.config import load_config
    from lmrl.data.tokenizers import load_tokenizer
    from lmrl.models import load_model
    from lmrl.trainers.lm_windows import load_windows, validation_stats
    from lmrl.trainers.pretrain.config import PretrainConfig

    stats, windows = {}, {}
    for run in run_dirs:
        config = load_config(PretrainConfig, str(run / "config.yaml"))
        key = (config.data, config.block_size, config.val_fraction, config.tokenizer)
        if key not in windows:  # every run of the experiment shares one corpus and split: tokenize once
            windows[key] = load_windows(config, load_tokenizer(str(run / "final"))).val
        limit = None if config.eval_batches is None else config.eval_batches * config.batch_size
        stats[run.name] = validation_stats(
            load_model(str(run / "final")), windows[key][:limit], config.batch_size, None
        )
    return stats


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": values,
    }


def summarize(out: Path, seeds: list[int]) -> dict:
    critic = metrics(out / "critic" / "metrics.jsonl")
    critic_ce = curve(critic, "eval/ce")
    runs = {o: {s: metrics(out / f"{o}-s{s}" / "metrics.jsonl") for s in seeds} for o in OBJECTIVES}
    val = {o: {s: curve(r, "eval/ce") for s, r in runs[o].items()} for o in OBJECTIVES}
    means = {o: mean_curve(list(val[o].values())) for o in OBJECTIVES}
    final = {o: [val[o][s][-1][1] for s in seeds] for o in OBJECTIVES}
    paired = [a - c for a, c in zip(final["avatarl"], final["ce"])]
    speed = {o: statistics.fmean(x for r in runs[o].values() for _, x in curve(r, "tokens_per_s")) for o in OBJECTIVES}
    wall = {o: statistics.fmean(r[-1]["time_s"] for r in runs[o].values()) for o in OBJECTIVES}
    rewards = {k: mean_curve([curve(r, k) for r in runs["avatarl"].values()]) for k in REWARD_KEYS}
    samples = {o: [row for row in read_jsonl(out / f"{o}-s{seeds[0]}" / "samples.jsonl")][-1] for o in OBJECTIVES}
    ablations = {}
    for name in sorted({p.parent.name.rsplit("-s", 1)[0] for p in out.glob("avatarl-*-s*/metrics.jsonl")}):
        curves = {s: curve(metrics(out / f"{name}-s{s}" / "metrics.jsonl"), "eval/ce") for s in seeds}
        done = [s for s in seeds if curves[s] and curves[s][-1][0] == means["ce"][-1][0]]  # finished runs only
        if not done:
            continue
        finals = [curves[s][-1][1] for s in done]
        ablations[name] = {
            **_stats(finals),
            "seeds": done,
            "val_ce_curve_mean": mean_curve([curves[s] for s in done]),
            "minus_ce_paired": _stats([f - val["ce"][s][-1][1] for f, s in zip(finals, done)]),
            "minus_avatarl_paired": _stats([f - val["avatarl"][s][-1][1] for f, s in zip(finals, done)]),
        }
    recomputed = final_model_stats(
        [
            out / "critic",
            *(out / f"{o}-s{s}" for o in OBJECTIVES for s in seeds),
            *(out / f"{name}-s{s}" for name, a in ablations.items() for s in a["seeds"]),
        ]
    )
    for o in OBJECTIVES:
        for s in seeds:  # the logged final val/ce and the recomputed one must agree
            if abs(recomputed[f"{o}-s{s}"]["eval/ce"] - val[o][s][-1][1]) > 1e-4:
                raise RuntimeError(
                    f"{o}-s{s}: final/ model gives val/ce {recomputed[f'{o}-s{s}']['eval/ce']:.5f}, "
                    f"metrics.jsonl says {val[o][s][-1][1]:.5f}; the run dir is inconsistent."
                )
    return {
        "final_models_val": recomputed,
        "command": "python experiments/avatarl/run.py --seeds "
        + " ".join(map(str, seeds))
        + (" --ablations" if ablations else ""),
        "ablations": ablations,
        "hardware": f"{platform.machine()}, {os.cpu_count()} shared CPU cores, 1 torch thread per run; load average "
        f"{os.getloadavg()[2]:.1f} (15 min) when summarised",
        "critic": {
            "val_ce": critic_ce[-1][1],
            "val_entropy": recomputed["critic"]["eval/entropy"],
            "tokens": critic_ce[-1][0],
            "val_ce_curve": critic_ce,
            "wall_s": critic[-1]["time_s"],
        },
        "seeds": seeds,
        "tokens_per_run": means["ce"][-1][0],
        "summary": {
            **{o: _stats(final[o]) for o in OBJECTIVES},
            "avatarl_minus_ce_paired": _stats(paired),
            "ce_tokens_to_reach_avatarl_final": tokens_to_reach(means["ce"], statistics.fmean(final["avatarl"])),
            "avatarl_tokens_to_reach_ce_final": tokens_to_reach(means["avatarl"], statistics.fmean(final["ce"])),
            # per seed (same init and data order): CE tokens to reach that seed's avatarl final val/ce
            "ce_tokens_to_reach_avatarl_final_paired": [
                tokens_to_reach(val["ce"][s], val["avatarl"][s][-1][1]) for s in seeds
            ],
            "tokens_per_s": speed,
            "wall_s": wall,
        },
        "val_ce_curves": {o: {str(s): c for s, c in val[o].items()} for o in OBJECTIVES},
        "avatarl_train_curves_mean": {k: v for k, v in rewards.items()},
        "final_samples_seed0": {
            o: {"prompt": samples[o]["prompt"], "continuation": samples[o]["continuation"]} for o in OBJECTIVES
        },
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    critic_ce, critic_tokens = results["critic"]["val_ce"], results["critic"]["tokens"]
    half = results["tokens_per_run"] / 2
    for ax, zoom in ((axes[0], False), (axes[1], True)):
        for o in OBJECTIVES:
            curves = results["val_ce_curves"][o]
            for c in curves.values():
                pts = [(x, y) for x, y in c if not zoom or x >= half]
                ax.plot([x / 1e6 for x, _ in pts], [y for _, y in pts], color=COLORS[o], alpha=0.3, lw=0.8)
            mean = mean_curve(list(curves.values()))
            pts = [(x, y) for x, y in mean if not zoom or x >= half]
            s = results["summary"][o]
            ax.plot(
                [x / 1e6 for x, _ in pts],
                [y for _, y in pts],
                color=COLORS[o],
                lw=2,
                label=f"{o} student: {s['mean']:.3f} ± {s['std']:.3f}",
            )
        for (name, ablation), style in zip(results["ablations"].items(), (":", "-.")):
            pts = [(x, y) for x, y in ablation["val_ce_curve_mean"] if not zoom or x >= half]
            ax.plot(
                [x / 1e6 for x, _ in pts],
                [y for _, y in pts],
                color="tab:purple",
                ls=style,
                lw=1.5,
                label=f"{name}: {ablation['mean']:.3f} ± {ablation['std']:.3f}",
            )
        ax.axhline(
            critic_ce,
            color="k",
            ls="--",
            lw=1,
            label=f"critic (CE, {critic_tokens / 1e6:.2f}M tokens): {critic_ce:.3f}",
        )
        ax.set_xlabel("training tokens (millions)")
        ax.set_ylabel("validation cross-entropy (nats/char)")
        ax.set_title("val/ce, second half" if zoom else f"val/ce (builtin:tiny, {len(results['seeds'])} seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[2]
    curves = results["avatarl_train_curves_mean"]
    for key, style in (("avatarl/expected_reward", "-"), ("avatarl/reward_mean", "--")):
        ax.plot([x / 1e6 for x, _ in curves[key]], [y for _, y in curves[key]], "tab:red", ls=style, label=key)
    ax.set_ylabel("reward")
    ax.set_xlabel("training tokens (millions)")
    twin = ax.twinx()
    for key, style in (("avatarl/active_size", "-."), ("avatarl/rewarded_per_position", ":")):
        twin.plot([x / 1e6 for x, _ in curves[key]], [y for _, y in curves[key]], "tab:green", ls=style, label=key)
    twin.set_ylabel("tokens per position", color="tab:green")
    ax.set_title("avatarl reward (mean over seeds; gold reward is always 1.5)")
    lines, more = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(out: Path, seeds: list[int], dest: Path) -> dict:
    results = summarize(out, seeds)
    (dest / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, dest / "avatarl_vs_ce.png")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default="runs/avatarl-experiment")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    write_results(Path(args.out), args.seeds, Path(__file__).resolve().parent)
