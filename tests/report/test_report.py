"""Run directories read for reports (corrupt lines, missing metrics), config diffs, and the HTML report's content."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from conftest import EVAL_ACC, GARBAGE_SKIPPED, KLS, REWARDS, write_rl_run

from lmrl.cli import main
from lmrl.report.dashboard import DashboardConfig, serve
from lmrl.report.figures import metric_figures, reward_vs_kl
from lmrl.report.html import ReportConfig, render, run
from lmrl.report.runs import config_diff, load_run, numeric_keys, read_jsonl


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


# issue 33: what users see of a real RL run (a 3-step GRPO run; `garbled_rl_run` adds garbage lines to it)


def test_the_reward_curve_of_an_rl_run_is_plotted_and_every_metric_is_in_a_panel(real_rl_run, tmp_path):
    data = load_run(real_rl_run)
    figs = metric_figures([data])
    assert [t.name for t in figs["reward"].data] == ["reward/mean"]  # main: reward/std and reward/errors drew here
    assert {"reward/std", "reward/errors"} <= {t.name for t in figs["reward: other"].data}
    plotted = {t.name for fig in figs.values() for t in fig.data}
    assert set(numeric_keys(data.metrics)) <= plotted
    html = run(ReportConfig(runs=[str(real_rl_run)], output_file=str(tmp_path / "r.html"))).read_text()
    ids = re.findall(r'<div id="(plot-[^"]+)"', html)
    assert len(ids) == len(set(ids)) == len(figs) + 1  # one element per figure (and reward vs KL)


def test_a_constant_lr_is_drawn_at_its_value(real_rl_run):
    lr = metric_figures([load_run(real_rl_run)])["lr"]
    assert set(lr.data[0].y) == {1e-4}
    low, high = lr.layout.yaxis.range  # main: none, so plotly spanned the flat line -1..1 and 1e-4 sat on "0"
    assert 0 < low < 1e-4 < high < 2e-4 and lr.layout.yaxis.exponentformat == "e"


def test_garbage_lines_are_skipped_with_a_count_and_the_report_is_written(garbled_rl_run, capsys):
    data = load_run(garbled_rl_run)
    assert data.skipped_lines == GARBAGE_SKIPPED + 1  # and the cut last line
    assert all(isinstance(r["step"], int) for r in data.metrics)
    assert main(["report", str(garbled_rl_run)]) == 0  # main: TypeError comparing a str step with an int
    assert f"{GARBAGE_SKIPPED + 1} corrupt line(s) skipped" in " ".join(capsys.readouterr().out.split())
    html = (garbled_rl_run / "report.html").read_text()
    assert f"{GARBAGE_SKIPPED + 1} corrupt line(s)" in html


def _strict_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read(), parse_constant=lambda name: pytest.fail(f"bare {name} in {url}"))


def test_the_dashboard_answers_strict_json_when_a_run_has_nan_metrics(garbled_rl_run):
    server = serve(DashboardConfig(runs_dir=str(garbled_rl_run.parent), port=0))
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        runs = _strict_json(f"{base}/api/runs")["runs"]  # main: bare NaN, which the page's JSON.parse refuses
        assert [(r["name"], r["step"], r["loss"]) for r in runs] == [("grpo-garbled", 4, "nan")]
        payload = _strict_json(f"{base}/api/run?name=grpo-garbled")
        assert len(set(payload["ids"].values())) == len(payload["figures"])
        reward = payload["figures"]["reward"]["data"]
        assert [t["name"] for t in reward] == ["reward/mean"] and reward[0]["y"][-1] is None  # NaN: a gap
        assert payload["skipped_lines"] == GARBAGE_SKIPPED
    finally:
        server.shutdown()


def test_report_and_dashboard_read_old_and_lossless_multi_turn_samples(tmp_path):
    from lmrl.report.dashboard import LiveRun, run_payload

    path = write_rl_run(tmp_path / "tools", corrupt=False)
    new = {
        "step": 5,
        "prompt": "<|im_start|>user\n47*83=<|im_end|>\n<|im_start|>assistant\n",
        "completion": "[calculator(expression='47*83')]<|im_end|>\n<|im_start|>tool\n3901<|im_end|>...",
        "messages": [{"role": "user", "content": "47*83="}, {"role": "assistant", "content": "3901"}],
        "turns": [[0, 33], [45, 50]],
        "token_roles": [["assistant", 1, 33], ["tool", 0, 12], ["assistant", 1, 5]],
        "reward": 1.0,
    }
    with (path / "samples.jsonl").open("a") as f:  # old rows (prompt, completion, rewards) and a new one
        f.write(json.dumps(new) + "\n")
    html = run(ReportConfig(runs=[str(path)], output_file=str(tmp_path / "r.html"))).read_text()
    assert "12+34=" in html and "47*83=" in html  # both kinds of rows
    assert "33 assistant, 12 tool (masked), 5 assistant" in html and "<th>messages</th>" not in html
    live = LiveRun(path, "tools")
    live.refresh()
    payload = run_payload(live, 12)
    assert payload["sample_cols"] == ["step", "prompt", "completion", "reward", "rewards/task", "tokens"]
    assert payload["samples"][-1]["tokens"] == "33 assistant, 12 tool (masked), 5 assistant"


def test_the_report_opens_on_the_curves_with_the_config_folded_below(rl_run):
    """Issue 47: the page opened on ~130 config rows, the first plot two screens down."""
    html = render([load_run(rl_run)])
    order = [html.index(f'<h2 id="{name}"') for name in ("runs", "metrics", "reward-vs-kl", "evals", "samples")]
    assert order == sorted(order) and order[-1] < html.index('<h2 id="config"')
    config = html[html.index('<h2 id="config"') :]
    assert config.index('<details id="config-details">') < config.index('<table id="config-table">')


def test_reward_vs_kl_is_a_scatter_coloured_by_step(rl_run):
    traces = {t.name: t for t in reward_vs_kl([load_run(rl_run)]).data}
    reward = traces["reward/mean"]
    assert reward.mode == "markers" and list(reward.marker.color) == [1, 2, 3, 4]
    assert reward.marker.showscale and not traces["eval/accuracy"].marker.showscale  # one colour bar
    assert list(traces["eval/accuracy"].marker.color) == [4]
