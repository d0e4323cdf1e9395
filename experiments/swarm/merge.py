"""Merge two results.json of the swarm experiment run on disjoint seeds (same recipe, same warm start) into one.

    python experiments/swarm/merge.py experiments/swarm/learnable/results.json runs/swarm-s34/results.json \
        --out experiments/swarm/learnable

Per-seed values (cumulative reward, gain and second-half gain vs 8/0) are joined and their statistics recomputed
(mean, paired t, seeds that beat 8/0); values that are already means over seeds (reward per round, groups per
round, rounds with an update, final pass rates, first/last-quarter reward) are averaged weighted by seed count,
which is the mean over all seeds. Equal to running ``run.py`` on all seeds at once, which needs every run directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plot import _mean, paired_t, plot  # noqa: E402

PER_SEED = ("cumulative_reward", "gain_vs_8_0", "second_half_gain_vs_8_0")
SEED_MEANS = (
    "mean_reward_first_quarter",
    "mean_reward_last_quarter",
    "groups_trained_per_round",
    "groups_external_per_round",
    "updates_per_node",
)


def _weighted(a, b, na: int, nb: int):
    """Mean over na + nb seeds from a mean over na seeds and one over nb (numbers, lists or dicts of them)."""
    if a is None or b is None:
        return a if b is None else b
    if isinstance(a, dict):
        return {k: _weighted(a[k], b[k], na, nb) for k in a}
    if isinstance(a, list):
        return [_weighted(x, y, na, nb) for x, y in zip(a, b)]
    return (a * na + b * nb) / (na + nb)


def merge(a: dict, b: dict) -> dict:
    seeds_a, seeds_b = a["setup"]["seeds"], b["setup"]["seeds"]
    if set(seeds_a) & set(seeds_b):
        raise SystemExit(f"the two results share seeds {sorted(set(seeds_a) & set(seeds_b))}; merge disjoint runs only")
    if a["setup"]["recipe"] != b["setup"]["recipe"] or a["warm_start_pass_rates"] != b["warm_start_pass_rates"]:
        raise SystemExit("the two results come from different recipes or warm starts: they cannot be merged")
    na, nb = len(seeds_a), len(seeds_b)
    base = {**a["table"]["8/0"]["cumulative_reward"], **b["table"]["8/0"]["cumulative_reward"]}
    table = {}
    for name, row_a in a["table"].items():
        row_b = b["table"][name]
        row = {key: {**row_a[key], **row_b[key]} for key in PER_SEED}
        row.update({key: _weighted(row_a[key], row_b[key], na, nb) for key in SEED_MEANS})
        cum, gains = row["cumulative_reward"], row["gain_vs_8_0"]
        row["cumulative_reward_mean"] = _mean(list(cum.values()))
        row["gain_vs_8_0_mean"] = _mean(list(gains.values()))
        row["paired_t_vs_8_0"] = None if name == "8/0" else paired_t([cum[s] - base[s] for s in cum])
        row["beats_8_0_in_seeds"] = f"{sum(g > 0 for g in gains.values())}/{len(gains)}"
        row["paper_cumulative_reward"] = row_a["paper_cumulative_reward"]
        row["final_pass_rates"] = _weighted(row_a["final_pass_rates"], row_b["final_pass_rates"], na, nb)
        table[name] = row
    return {
        "command": f"{a['command']}\n{b['command']}\nmerged by experiments/swarm/merge.py",
        "seconds": (a["seconds"] or 0) + (b["seconds"] or 0),
        "hardware": a["hardware"],
        "setup": {**a["setup"], "seeds": sorted(seeds_a + seeds_b)},
        "warm_start_pass_rates": a["warm_start_pass_rates"],
        "table": table,
        "reward_per_round_mean": _weighted(a["reward_per_round_mean"], b["reward_per_round_mean"], na, nb),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="directory for the merged results.json and plot")
    args = parser.parse_args(argv)
    results = merge(json.loads(args.first.read_text()), json.loads(args.second.read_text()))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "swarm_configs.png")
    for name, row in results["table"].items():
        print(
            f"{name}: {row['cumulative_reward_mean']:.2f} ({100 * row['gain_vs_8_0_mean']:+.1f}% vs 8/0, beats 8/0 in "
            f"{row['beats_8_0_in_seeds']}, paired t {row['paired_t_vs_8_0']})"
        )


if __name__ == "__main__":
    main()
