"""Summarise the swarm experiment's runs: results.json and swarm_configs.png next to this file."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from lmrl.report.metric_names import upgrade

PAPER = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}
"""Cumulative reward over 8 agents x 2000 rounds in SAPO (arXiv 2509.08721, Table 1)."""


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _moving(xs: list[float], k: int) -> list[float]:
    return [_mean(xs[max(0, i - k + 1) : i + 1]) for i in range(len(xs))]


def _late(summary: dict) -> float:
    """Cumulative reward of the second half of the rounds (8 nodes): what the nodes have learned by then."""
    rewards = summary["reward_per_round"]
    return summary["nodes"] * sum(rewards[len(rewards) // 2 :])


def node_group_stats(out: Path, name: str, by_seed: dict[int, dict]) -> dict[str, float]:
    """Per node and round, averaged over nodes, rounds and seeds: question groups trained on and taken from
    peers, and the number of rounds with an update (a round with no informative group has none)."""
    trained, external, updates = [], [], []
    for s in by_seed:
        for node_dir in sorted((out / f"{name.replace('/', '-')}-s{s}" / "nodes").iterdir()):
            records = [
                upgrade(json.loads(line)) for line in (node_dir / "metrics.jsonl").read_text().splitlines() if line
            ]
            trained += [r["swarm/groups/trained"] for r in records]
            external += [r.get("swarm/groups/external", 0.0) for r in records]
            updates.append(sum(r["swarm/groups/trained"] > 0 for r in records))
    return {
        "groups_trained_per_round": round(_mean(trained), 3),
        "groups_external_per_round": round(_mean(external), 3),
        "updates_per_node": round(_mean(updates), 1),
    }


def paired_t(diffs: list[float]) -> float | None:
    """Paired t statistic of per-seed differences (n - 1 degrees of freedom); None below 2 seeds or at 0 spread."""
    n = len(diffs)
    if n < 2:
        return None
    mean = _mean(diffs)
    sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5
    return mean / (sd / n**0.5) if sd > 0 else None


def family_rates(out: Path, name: str, seeds: list[int]) -> dict[str, float] | None:
    """Pass rate per task family of the final models, mean over nodes and seeds (``<run>/pass_rates.json``)."""
    per_model = []
    for s in seeds:
        path = out / f"{name.replace('/', '-')}-s{s}" / "pass_rates.json"
        if path.exists():
            per_model += list(json.loads(path.read_text()).values())
    if not per_model:
        return None
    return {task: round(_mean([m[task] for m in per_model]), 4) for task in per_model[0]}


def write_results(
    out: Path,
    seeds: list[int],
    configs: list[tuple[int, int]],
    here: Path,
    command: str,
    seconds: float | None,
    recipe: str = "swarm/tiny_sim",
) -> dict:
    summaries: dict[str, dict[int, dict]] = {}
    for i, j in configs:
        for s in seeds:
            path = out / f"{i}-{j}-s{s}" / "swarm_summary.json"
            if path.exists():
                summaries.setdefault(f"{i}/{j}", {})[s] = json.loads(path.read_text())
    if "8/0" not in summaries:
        raise SystemExit(f"no 8/0 runs under {out}; run the experiment first")
    base = {s: v["cumulative_reward"] for s, v in summaries["8/0"].items()}
    base_late = {s: _late(v) for s, v in summaries["8/0"].items()}
    groups = {name: node_group_stats(out, name, by_seed) for name, by_seed in summaries.items()}
    table = {}
    for name, by_seed in summaries.items():
        cum = {s: v["cumulative_reward"] for s, v in by_seed.items()}
        gains = {s: cum[s] / base[s] - 1 for s in cum if s in base and base[s] > 0}
        rounds = len(next(iter(by_seed.values()))["reward_per_round"])
        last = max(1, rounds // 4)
        table[name] = {
            "cumulative_reward": cum,
            "cumulative_reward_mean": _mean(list(cum.values())),
            "gain_vs_8_0": gains,
            "gain_vs_8_0_mean": _mean(list(gains.values())) if gains else None,
            "paired_t_vs_8_0": None if name == "8/0" else paired_t([cum[s] - base[s] for s in cum if s in base]),
            "beats_8_0_in_seeds": f"{sum(g > 0 for g in gains.values())}/{len(gains)}",
            "second_half_gain_vs_8_0": {
                s: _late(v) / base_late[s] - 1 for s, v in by_seed.items() if base_late.get(s, 0) > 0
            },
            "mean_reward_first_quarter": _mean([_mean(v["reward_per_round"][:last]) for v in by_seed.values()]),
            "mean_reward_last_quarter": _mean([_mean(v["reward_per_round"][-last:]) for v in by_seed.values()]),
            "paper_cumulative_reward": PAPER.get(name),
            **groups[name],
            "final_pass_rates": family_rates(out, name, list(by_seed)),
        }
    previous = json.loads((here / "results.json").read_text()) if (here / "results.json").exists() else {}
    if seconds is None and previous.get("seconds") is not None:  # --plot-only keeps the measured run's time
        seconds, command = previous["seconds"], previous["command"]
    first = next(iter(summaries["8/0"].values()))
    results = {
        "command": command,
        "seconds": None if seconds is None else round(seconds),
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared), one torch thread per run",
        "setup": {
            "recipe": recipe,
            "nodes": first["nodes"],
            "rounds": first["rounds"],
            "samples_per_prompt": first["samples_per_prompt"],
            "seeds": seeds,
            "metric": "cumulative reward = sum over nodes and rounds of each node's mean reward on its own "
            "rollouts (0/1 verifier)",
        },
        "warm_start_pass_rates": (
            json.loads((out / "warm_start_pass_rates.json").read_text())["pass_rates"]
            if (out / "warm_start_pass_rates.json").exists()
            else None
        ),
        "table": table,
        "reward_per_round_mean": {
            name: [_mean(list(x)) for x in zip(*[v["reward_per_round"] for v in by.values()])]
            for name, by in summaries.items()
        },
    }
    here.mkdir(parents=True, exist_ok=True)
    (here / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, here / "swarm_configs.png")
    for name, row in table.items():
        gain = "" if row["gain_vs_8_0_mean"] is None else f"  {100 * row['gain_vs_8_0_mean']:+.1f}% vs 8/0"
        print(
            f"{name}: cumulative reward {row['cumulative_reward_mean']:.2f}{gain}  (beats 8/0 in "
            f"{row['beats_8_0_in_seeds']} seeds; paper {row['paper_cumulative_reward']})"
        )
    return results


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, curve in results["reward_per_round_mean"].items():
        ax1.plot(range(1, len(curve) + 1), _moving(curve, 25), label=name)
    ax1.set_xlabel("round")
    ax1.set_ylabel("mean own reward per node (25-round moving avg)")
    ax1.grid(alpha=0.3)
    ax1.legend(title="local/external")
    names = list(results["table"])
    for k, name in enumerate(names):
        row = results["table"][name]
        values = list(row["cumulative_reward"].values())
        ax2.bar(k, row["cumulative_reward_mean"], color=f"C{k}", alpha=0.6)
        ax2.scatter([k] * len(values), values, color="black", s=12, zorder=3)
    ax2.set_xticks(range(len(names)), names)
    ax2.set_ylabel("cumulative reward (8 nodes, all rounds)")
    ax2.set_title(f"seeds {results['setup']['seeds']}")
    ax2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
