"""The pure parts of the plot controls and the run list: EMA smoothing, panels, per-run colours, run state."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import write_rl_run

from lmrl.report.dashboard import LiveRun, run_state
from lmrl.report.figures import COLORS, FIRST, THROUGHPUT, ema, is_internal, metric_figures, metric_groups
from lmrl.report.runs import load_run


def test_ema_is_tensorboards_debiased_moving_average():
    # weight 0.5 over 1, 2, 3: averages 0.5, 1.25, 2.125 over debias 1 - 0.5^n = 0.5, 0.75, 0.875
    assert ema([1.0, 2.0, 3.0], 0.5) == pytest.approx([1.0, 5 / 3, 17 / 7], rel=1e-12)
    # a gap is passed through and leaves the average alone: (0.5 * 0.5 + 0.5 * 3) / 0.75 = 7/3
    gap = ema([1.0, None, 3.0], 0.5)
    assert gap[1] is None and gap[::2] == pytest.approx([1.0, 7 / 3], rel=1e-12)
    assert ema([4.0, float("nan"), 6.0], 0.0)[::2] == [4.0, 6.0]  # weight 0: the raw values


def test_throughput_has_its_own_panel_not_an_axis_shared_with_0_1_metrics():
    groups = metric_groups(["loss", "tokens_per_s", "optim/grad_norm", "reward/mean", "samples_per_s", "time/train_s"])
    assert groups == {
        "loss": ["loss"],
        "reward": ["reward/mean"],
        THROUGHPUT: ["tokens_per_s", "samples_per_s"],
        "optim": ["optim/grad_norm"],
        "time": ["time/train_s"],
    }


def test_the_curves_lead_and_the_internal_counters_are_set_apart(real_rl_run):
    """Issue 47: reward, accuracy, loss, KL and completion length first; the update's counters in their own section."""
    figs = metric_figures([load_run(real_rl_run)])
    assert list(figs)[: len(FIRST)] == ["reward", "accuracy", "loss", "kl", "completion_len"]
    assert [name for name in figs if is_internal(name)] == ["memory", "policy", "update", "time", "memory: other"]
    dpo = metric_groups(["policy/accuracy", "policy/margin", "policy/logp_chosen", "policy/clip_frac", "update/packed"])
    assert {name: is_internal(name) for name in dpo} == {
        "accuracy": False,  # DPO's headline policy/ metrics stay with the curves
        "margin": False,
        "logps": False,
        "policy": True,
        "update": True,
    }


def test_a_run_keeps_its_colour_in_every_panel_and_single_metric_panels_are_labelled(tmp_path):
    runs = [load_run(write_rl_run(tmp_path / name, lr=lr)) for name, lr in (("grpo-a", 1e-3), ("grpo-b", 1e-4))]
    figs = metric_figures(runs)
    for fig in figs.values():
        for trace in fig.data:
            assert trace.line.color == COLORS[0 if trace.name.startswith("grpo-a:") else 1], trace.name
    keys = {t.name.split(": ")[1]: t.line.dash for fig in figs.values() for t in fig.data}
    assert keys == {"loss": "solid", "reward/mean": "solid", "eval/accuracy": "solid", "kl": "solid"}
    one = metric_figures(runs[:1])["loss"]
    assert one.layout.showlegend is True and one.layout.yaxis.title.text == "loss"
    assert one.layout.uirevision == "keep"  # zoom and legend clicks survive the dashboard's redraws


def test_metric_traces_carry_time_since_start_for_the_time_axis(rl_run):
    figs = metric_figures([load_run(rl_run)])
    reward = figs["reward"].data[0]
    assert list(reward.x) == [1, 2, 3, 4] and list(reward.customdata) == [1.5, 3.0, 4.5, 6.0]  # time_s = 1.5 * step
    assert list(figs["accuracy"].data[0].customdata) == [None, None]  # eval lines of the fixture have no time_s


def test_run_state_running_finished_stopped(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    now = time.time()
    os.utime(run / "metrics.jsonl", (now - 10, now - 10))
    assert run_state(run, now, stale_s=120) == "running"
    assert run_state(run, now, stale_s=5) == "stopped"  # crashed or killed: no final/, no recent metrics
    node = run / "nodes" / "node-0"
    node.mkdir(parents=True)
    (node / "metrics.jsonl").write_text("")
    os.utime(node / "metrics.jsonl", (now - 1, now - 1))
    assert run_state(run, now, stale_s=5) == "running"  # a swarm whose nodes still log
    (run / "final").mkdir()
    assert run_state(run, now, stale_s=5) == "finished"
    live = LiveRun(run, "r")
    live.refresh()
    assert live.summary(stale_s=5)["state"] == "finished"
