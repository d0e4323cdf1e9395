"""The offline difficulty filter: pass rates from N scripted samples per prompt, the rows kept in [lo, hi] written
with every column, the spread, and bad ranges refused."""

import json

import pytest
from test_eval_runner import ScriptedEngine

from lmrl.cli import main
from lmrl.config import ConfigError, load_config
from lmrl.data.loading import load_rows
from lmrl.data.tasks import get_task
from lmrl.eval import runner
from lmrl.eval.difficulty import FilterConfig, spread
from tests.helpers import TINY


def filter_scripted(tmp_path, monkeypatch, rows, script, *bounds) -> int:
    """`lmrl filter` of ``rows`` into tmp_path/kept.jsonl, the tiny model's 4 samples a prompt scripted (``script``:
    prompt -> completions); its exit code."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ScriptedEngine.script = script
    monkeypatch.setattr(runner, "HFEngine", ScriptedEngine)
    args = [
        "filter",
        f"dataset={data}",
        "samples=4",
        *bounds,
        "precision=fp32",
        f"output_file={tmp_path / 'kept.jsonl'}",
    ]
    return main([*args, *TINY])


def test_spread_counts_each_bin():
    assert spread([0, 0, 0.1, 0.2, 0.5, 0.8, 0.9, 1, 1, 1], 0.2, 0.8) == {
        "0 (never)": 2,
        "(0, 0.2)": 1,
        "[0.2, 0.8] kept": 3,
        "(0.8, 1)": 1,
        "1 (always)": 3,
    }
    assert spread([0.0, 1.0], 0.0, 1.0)["[0, 1] kept"] == 2  # the bounds are inclusive


def test_filter_keeps_the_rows_in_range_with_their_columns(tmp_path, monkeypatch):
    rows = [
        {"prompt": f"{a}+{b}=", "answer": str(a + b), "task": "arithmetic", "meta": {"a": a, "b": b}}
        for a, b in ((1, 1), (2, 5), (3, 3), (4, 4))
    ]
    script = {
        "1+1=": ["2", "2", "2", "2"],  # 4/4: always solved, dropped
        "2+5=": ["7", "6", "6", "6"],  # 1/4 = 0.25: kept
        "3+3=": ["6", "6", "6", "5"],  # 3/4: kept
        "4+4=": ["1", "2", "3", "4"],
    }  # 0/4: never solved, dropped
    assert filter_scripted(tmp_path, monkeypatch, rows, script, "min_pass=0.2", "max_pass=0.8") == 0
    kept = load_rows(str(tmp_path / "kept.jsonl"))
    assert [(r["prompt"], r["pass_rate"]) for r in kept] == [("2+5=", 0.25), ("3+3=", 0.75)]
    assert kept[0]["meta"] == {"a": 2, "b": 5}  # every column survives, so the task's verifier still scores it
    assert get_task(kept[0]["task"]).score("7", kept[0]["answer"], kept[0]["meta"]) == 1.0


def test_bad_ranges_are_refused():
    with pytest.raises(ConfigError, match="min_pass <= max_pass"):
        load_config(FilterConfig, None, ["min_pass=0.9", "max_pass=0.1"])
    with pytest.raises(ConfigError, match="temperature"):
        load_config(FilterConfig, None, ["temperature=0"])


def test_an_empty_result_names_the_bound_that_emptied_it_and_keeps_the_rates(tmp_path, monkeypatch, capsys):
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a), "task": "arithmetic", "meta": {}} for a in (1, 2)]
    script = {"1+1=": ["2", "2", "2", "2"], "2+2=": ["4", "4", "4", "1"]}  # pass rates 1 and 0.75
    assert filter_scripted(tmp_path, monkeypatch, rows, script, "min_pass=0.1", "max_pass=0.5") == 2
    out = tmp_path / "kept.jsonl"
    message = " ".join(capsys.readouterr().out.split())
    assert "max_pass=0.5 emptied it (all 2 rows are above)" in message, message
    assert not out.exists()
    rated = load_rows(str(tmp_path / "kept.all_rates.jsonl"))
    assert [r["pass_rate"] for r in rated] == [1.0, 0.75]


def test_the_empty_message_says_which_side_of_the_range_the_rates_fell_on(tmp_path):
    from lmrl.eval.difficulty import empty_message

    assert "min_pass=0.2 emptied it (all 3 rows are below)" in empty_message([0, 0, 0.1], 0.2, 0.8, tmp_path)
    between = empty_message([0.1, 0.9], 0.4, 0.6, tmp_path)
    assert "falls between the rates (1 rows below min_pass, 1 above max_pass)" in between
