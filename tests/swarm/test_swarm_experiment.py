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
