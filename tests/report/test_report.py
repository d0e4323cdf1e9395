"""Run directories read for reports (corrupt lines, missing metrics), config diffs, and the HTML report's content."""

from __future__ import annotations

import re

from conftest import EVAL_ACC, KLS, REWARDS, write_rl_run

from lmrl.cli import main
from lmrl.report.figures import metric_figures, reward_vs_kl
from lmrl.report.html import ReportConfig, run
from lmrl.report.runs import config_diff, load_run, read_jsonl


def test_corrupt_lines_are_skipped_and_counted(rl_run):
    data = load_run(rl_run)
    assert data.skipped_lines == 1
    assert [r["reward/mean"] for r in data.metrics if "reward/mean" in r] == REWARDS[1:]
    assert data.is_rl and data.last("eval/accuracy") == EVAL_ACC[4]
    assert [c["name"] for c in data.checkpoints] == ["step-4", "final"]
    assert data.evals[0]["metrics"]["pass@4"] == 0.6125


def test_incremental_read_waits_for_a_complete_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    first = read_jsonl(path)
    assert [r["step"] for r in first.records] == [1] and first.skipped == 0
    path.write_text('{"step": 1}\n{"step": 2, "loss": 0.5}\n')
    assert read_jsonl(path, first.offset).records == [{"step": 2, "loss": 0.5}]


def test_run_dir_without_metrics_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "has no metrics.jsonl" in err and "output_dir" in err
    assert main(["report"]) == 2
    assert "needs at least one run directory" in " ".join(capsys.readouterr().out.split())


def test_config_diff():
    differ, same = config_diff([{"lr": 1e-3, "model": "a", "x": [1]}, {"lr": 3e-3, "model": "a", "y": 2}])
    assert differ == ["lr", "x", "y"] and same == ["model"]


def test_figures_hold_the_runs_numbers(rl_run):
    data = load_run(rl_run)
    figs = metric_figures([data])
    reward = next(t for t in figs["reward"].data if t.name == "reward/mean")
    assert list(reward.y) == REWARDS[1:] and list(reward.x) == [1, 2, 3, 4]
    kl = reward_vs_kl([data])
    by_name = {t.name: t for t in kl.data}
    assert list(by_name["reward/mean"].x) == KLS[1:]
    assert list(by_name["eval/accuracy"].y) == [EVAL_ACC[4]]  # eval at step 4 drawn at that step's KL
    assert list(by_name["eval/accuracy"].x) == [KLS[4]]


def test_report_html_is_self_contained_and_shows_the_numbers(rl_run, tmp_path):
    other = write_rl_run(tmp_path / "runs" / "grpo-b", lr=3e-3, corrupt=False)
    out = run(ReportConfig(runs=[str(rl_run), str(other)], output_file=str(tmp_path / "cmp.html")))
    html = out.read_text()
    assert not re.search(r"<script[^>]+src=", html)  # plotly.js inlined, nothing fetched
    assert 'id="plot-reward-vs-kl"' in html and re.search(r"grpo-a: reward(/|\\u002f)mean", html)  # plotly escapes /
    assert re.search(r'<tr class="differ"><td>lr</td>', html)  # the config key that differs
    assert "0.345" in html and "0.6125" in html  # final eval and lmrl eval's file
    assert "1 corrupt line(s)" in html
    assert "step-4" in html and "2.0" in html  # the checkpoint and its size in MB
