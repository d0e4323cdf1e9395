"""Metric namespaces (docs/metrics.md): every logged name has one, and runs written under the old names still read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import KLS, REWARDS, write_rl_run

from lmrl.report.dashboard import LiveRun
from lmrl.report.figures import metric_figures, reward_vs_kl
from lmrl.report.html import ReportConfig, run
from lmrl.report.metric_names import RENAMED, current_name, upgrade
from lmrl.report.runs import load_run, numeric_keys
from lmrl.tracking import KEY_METRICS, NAMESPACES, PLOT_GROUPS
from lmrl.trainers.best import BestKeeper

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
METHOD_NAMESPACES = {"avatarl", "challenger", "solver", "label", "rs", "swarm", "warm_start", "node", "initial"}
STANDARD = {"loss", "kl", "entropy", "lr", "completion_len/mean", "tokens_per_s"}  # DESIGN.md's names, kept as they are


def test_old_names_map_to_namespaced_names_and_current_names_stay():
    assert current_name("loss") == "loss" and current_name("kl") == "kl"
    assert current_name("rewards/math/mean") == "reward/math/mean"  # each reward function
    assert current_name("evals/pass@8") == "eval/metrics/pass@8"  # eval_metrics=[pass@8]
    assert current_name("initial/val/ce") == "initial/eval/ce"
    assert current_name("node/node-0/cumulative_reward") == "node/node-0/reward/cumulative"
    assert current_name("groups/trained") == "swarm/groups/trained"  # the swarm's; RL's groups/* one by one
    assert current_name("groups/zero_variance_frac") == "rollout/zero_variance_frac"
    for name in ("loss", "reward/mean", "eval/accuracy", "policy/clip_frac", "avatarl/loss", "time/train_s"):
        assert current_name(name) == name
    for old, new in RENAMED.items():
        assert current_name(new) == new, old  # no chains: a current name is never an old one
        assert new in STANDARD or new.split("/")[0] in {*NAMESPACES, *METHOD_NAMESPACES}, new
    # a record holding both (a run resumed across the rename) keeps the current value
    assert upgrade({"step": 3, "clip_frac": 1.0, "policy/clip_frac": 2.0}) == {"step": 3, "policy/clip_frac": 2.0}


def test_docs_and_plots_name_only_current_metrics():
    documented = DOCS.read_text()
    for new in {n for n in RENAMED.values() if not n.startswith(("challenger/", "solver/"))}:  # roles: <role>/*
        assert f"`{new}`" in documented or new in documented, f"{new} is not in docs/metrics.md"
    for name in [*KEY_METRICS, *(k for keys in PLOT_GROUPS.values() for k in keys)]:
        assert current_name(name) == name, name
    assert next(iter(PLOT_GROUPS)) == "reward"


def test_a_real_rl_run_logs_every_metric_in_a_namespace(real_rl_run):
    keys = numeric_keys(load_run(real_rl_run).metrics)
    assert {"loss", "reward/mean", "entropy", "lr", "completion_len/mean", "tokens_per_s", "eval/accuracy"} <= set(keys)
    outside = [
        k
        for k in keys
        if k not in STANDARD and ("/" not in k or k.split("/")[0] not in {*NAMESPACES, *METHOD_NAMESPACES})
    ]
    assert outside == []
    with (real_rl_run / "metrics.jsonl").open() as f:  # written as read: nothing was renamed on the way in
        assert all(current_name(k) == k for line in f for k in json.loads(line))


def write_old_run(path: Path) -> Path:
    """An RL run as lmrl wrote it before the namespaces: loss, kl, lr, clip_frac, completion_len/mean, ..."""
    write_rl_run(path, corrupt=False, old_names=True)
    with (path / "metrics.jsonl").open("a") as f:
        for step in (1, 2, 3, 4):
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "lr": 1e-3,
                        "grad_norm": 0.5,
                        "entropy": 2.0,
                        "clip_frac": 0.1,
                        "completion_len/mean": 3.0 + step,
                        "completion/truncated_frac": 0.0,
                        "tokens_per_s": 100.0,
                        "time/train_s": 0.2,
                        "rewards/task/mean": REWARDS[step],
                        "groups/zero_variance_frac": 0.25,
                    }
                )
                + "\n"
            )
        f.write(json.dumps({"step": 4, "evals/pass@4": 0.6}) + "\n")
    return path


def test_an_old_run_renders_with_the_new_panels_and_the_reward_curve_first(tmp_path):
    old = load_run(write_old_run(tmp_path / "old"))
    keys = numeric_keys(old.metrics)
    assert {
        "loss",
        "kl",
        "lr",
        "policy/clip_frac",
        "completion_len/mean",
        "tokens_per_s",
        "reward/task/mean",
        "eval/metrics/pass@4",
    } <= set(keys)
    assert not {"clip_frac", "grad_norm", "completion/truncated_frac", "rewards/task/mean", "evals/pass@4"} & set(keys)
    figs = metric_figures([old])
    names = list(figs)
    assert names[0] == "reward" and [t.name for t in figs["reward"].data] == ["reward/mean"]
    assert list(figs["reward"].data[0].y) == REWARDS[1:]
    assert [t.name for t in figs["loss"].data] == ["loss"] and [t.name for t in figs["kl"].data] == ["kl"]
    # the rest by namespace, in docs/metrics.md's order: policy, rollout, optim, time (throughput), eval
    rest = [n for n in names if n in ("policy", "rollout", "optim", "throughput", "time", "eval")]
    assert rest == ["policy", "rollout", "optim", "throughput", "time", "eval"], names
    assert names.index("loss") < names.index("policy") < names.index("rollout") < names.index("eval")
    kl = {t.name: t for t in reward_vs_kl([old]).data}
    assert list(kl["reward/mean"].x) == KLS[1:]  # the old "kl" drawn as kl
    html = run(ReportConfig(runs=[str(old.path)], output_file=str(tmp_path / "old.html"))).read_text()
    assert re.search(r"policy(/|\\u002f)clip_frac", html) and not re.search(r'"name":\s*"clip_frac"', html)


def test_old_and_new_runs_compare_in_the_same_panels(tmp_path):
    old = load_run(write_rl_run(tmp_path / "old", corrupt=False, old_names=True))
    new = load_run(write_rl_run(tmp_path / "new", corrupt=False))
    assert old.metrics == new.metrics and old.is_rl
    figs = metric_figures([old, new])
    assert {t.name for t in figs["loss"].data} == {"old: loss", "new: loss"}


def test_the_dashboard_shows_an_old_run_under_the_new_names(tmp_path):
    live = LiveRun(write_old_run(tmp_path / "old"), "old")
    live.refresh()
    summary = live.summary()
    assert summary["loss"] == pytest.approx(1 / 4) and summary["lr"] == 1e-3 and "clip_frac" not in summary


def test_keep_best_accepts_an_old_name_and_an_old_best_json(tmp_path):
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "best.json").write_text(json.dumps({"metric": "val/ce", "value": 2.5, "step": 10}))
    with pytest.warns(FutureWarning, match="keep_best='val/ce': metrics are now named 'eval/ce'"):
        keeper = BestKeeper(tmp_path, "val/ce")
    assert (keeper.metric, keeper.value, keeper.step, keeper.lower) == ("eval/ce", 2.5, 10, True)
    assert BestKeeper(tmp_path, "eval/ce").value == 2.5  # the current name reads the old record too
