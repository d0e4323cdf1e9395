"""The swarm experiment's helpers (experiments/swarm): the paired t statistic and the per-family pass rates."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from lmrl.config import load_config
from lmrl.swarm.config import SwarmConfig

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "swarm"


def _module(name: str):
    sys.path.insert(0, str(EXPERIMENT))
    try:
        spec = importlib.util.spec_from_file_location(f"swarm_experiment_{name}", EXPERIMENT / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXPERIMENT))


def test_paired_t_by_hand():
    plot = _module("plot")
    # diffs 1, 2, 3: mean 2, sample sd 1, t = 2 / (1 / sqrt(3)) = 3.4641
    assert plot.paired_t([1.0, 2.0, 3.0]) == pytest.approx(3.4641, abs=1e-4)
    assert plot.paired_t([-1.0, -2.0, -3.0]) == pytest.approx(-3.4641, abs=1e-4)
    assert plot.paired_t([5.0]) is None and plot.paired_t([2.0, 2.0]) is None  # one seed; no spread


def test_family_pass_rates_cover_every_family_of_the_mix(tmp_path):
    passrates = _module("passrates")
    config = load_config(SwarmConfig, "swarm/tiny_sim_learnable", ["max_new_tokens=2"])
    model = "builtin:tiny"  # random init: answers are noise, so every rate is a valid fraction, mostly 0
    rates = passrates.family_pass_rates(model, config, questions=2, samples=2, log=tmp_path / "log")
    assert list(rates) == list(dict.fromkeys(config.tasks))
    assert all(0.0 <= r <= 1.0 for r in rates.values())


def _results(seeds, cum_80, cum_44, rewards, groups):
    rows = {}
    for name, cum in (("8/0", cum_80), ("4/4", cum_44)):
        rows[name] = {
            "cumulative_reward": dict(zip(seeds, cum)),
            "gain_vs_8_0": {s: c / b - 1 for s, c, b in zip(seeds, cum, cum_80)},
            "second_half_gain_vs_8_0": {s: 0.0 for s in seeds},
            "paper_cumulative_reward": None,
            "mean_reward_first_quarter": rewards[0],
            "mean_reward_last_quarter": rewards[-1],
            "groups_trained_per_round": groups,
            "groups_external_per_round": 0.0,
            "updates_per_node": 300.0,
            "final_pass_rates": {"count": groups / 10},
        }
    return {
        "command": "c",
        "seconds": 1,
        "hardware": "h",
        "setup": {"recipe": "r", "seeds": seeds},
        "warm_start_pass_rates": {"count": 0.25},
        "table": rows,
        "reward_per_round_mean": {"8/0": rewards, "4/4": rewards},
    }


def test_merging_disjoint_seeds_recomputes_per_seed_statistics_and_weights_means_by_seed_count():
    merge = _module("merge")
    a = _results(["0", "1"], [10.0, 12.0], [11.0, 12.0], [0.2, 0.4], 2.0)
    b = _results(["2"], [11.0], [13.0], [0.5, 0.1], 5.0)
    row = merge.merge(a, b)["table"]["4/4"]
    assert row["cumulative_reward"] == {"0": 11.0, "1": 12.0, "2": 13.0}
    assert row["cumulative_reward_mean"] == pytest.approx(12.0)
    assert row["gain_vs_8_0_mean"] == pytest.approx((0.1 + 0.0 + 2 / 11) / 3)
    assert row["paired_t_vs_8_0"] == pytest.approx(3**0.5)  # diffs 1, 0, 2: mean 1, sd 1
    assert row["beats_8_0_in_seeds"] == "2/3"
    assert row["groups_trained_per_round"] == pytest.approx(3.0)  # (2 * 2 + 5) / 3
    assert row["final_pass_rates"] == {"count": pytest.approx(0.3)}
    assert merge.merge(a, b)["reward_per_round_mean"]["8/0"] == pytest.approx([0.3, 0.3])
    with pytest.raises(SystemExit, match="share seeds"):
        merge.merge(a, a)
