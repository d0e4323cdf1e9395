"""pass@k and τ-bench pass^k estimators; `lmrl eval` with tools."""

import json
import sys
from itertools import combinations
from pathlib import Path

import pytest

from lmrl.eval.tools import pass_at_k, pass_hat_k
from tests.helpers import TINY, TOOL_RUN

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout"))
from scripted_policy import CalculatorPolicy  # noqa: E402


@pytest.mark.parametrize("n, c, k", [(4, 0, 1), (4, 2, 2), (5, 3, 2), (8, 8, 4), (6, 1, 3), (3, 2, 3)])
def test_estimators_match_counting_every_k_subset(n, c, k):
    trials = [1] * c + [0] * (n - c)
    subsets = list(combinations(trials, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_pass_hat_k_is_at_most_pass_at_k_and_equal_at_k1():
    assert pass_hat_k(10, 4, 1) == pass_at_k(10, 4, 1) == 0.4
    assert pass_hat_k(10, 4, 3) < 0.4 < pass_at_k(10, 4, 3)


def test_bad_counts_fail():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_hat_k(3, 1, 4)


# `lmrl eval` with tools: the training-time tool loop, and the same numbers as training's held-out tool eval.

TOOL_KEYS = [
    *TOOL_RUN,
    *TINY,
    "precision=fp32",
]


def _eval_and_training_eval(tmp_path, *overrides):
    """(`lmrl eval` metrics, its JSON, the training-time tool eval's metrics and samples) on the same rows."""
    from lmrl.config import load_config
    from lmrl.data.loading import load_rows
    from lmrl.eval import cli as eval_cli
    from lmrl.models.setup import ModelSetup
    from lmrl.rollout.tools.section import build_env_factory
    from lmrl.trainers.rl import trainer as online

    config = load_config(
        eval_cli.EvalConfig, None, [*TOOL_KEYS, "rows=6", f"output_file={tmp_path / 'e.json'}", *overrides]
    )
    metrics = eval_cli.run(config)
    rl = load_config(online.RLConfig, None, [*TOOL_KEYS, "eval_rows=6", f"output_dir={tmp_path / 'rl'}"])
    model, tokenizer = ModelSetup.from_config(rl).policy()
    rows = load_rows("task:tool_arithmetic", split="test", limit=6, digits=2)
    trained, samples = online.evaluate(model, tokenizer, rows, rl, None, build_env_factory(rl, tokenizer))
    return metrics, json.loads((tmp_path / "e.json").read_text()), trained, samples, rows


def test_eval_with_tools_runs_episodes_scored_like_training(tmp_path, monkeypatch):
    from lmrl.eval import runner

    monkeypatch.setattr(runner, "HFEngine", CalculatorPolicy)  # calls the calculator, answers right on even a
    metrics, saved, trained, _, rows = _eval_and_training_eval(
        tmp_path, "metrics=[accuracy,pass@2,pass^2]", "samples=4"
    )
    even = sum(int(r["prompt"].split("*")[0]) % 2 == 0 for r in rows) / len(rows)
    assert 0 < even < 1 and metrics["accuracy"] == pytest.approx(even)  # without tools: 0 (the call is no answer)
    assert metrics["tools/calls_per_episode"] == 1.0 and metrics["tools/call_errors_per_episode"] == 0.0
    assert trained == {"eval/accuracy": metrics["accuracy"], "eval/tool_calls_per_episode": 1.0}
    assert metrics["pass^2"] <= metrics["pass@2"] <= even  # sampled turns answer right half the time
    assert "<|im_start|>tool" in saved["samples"][0]["completion"]  # the transcript
    assert saved["config"]["tools"] == ["calculator"]


def test_eval_with_tools_equals_the_training_time_tool_eval_on_a_real_model(tmp_path):
    metrics, saved, trained, samples, _ = _eval_and_training_eval(tmp_path, "metrics=[accuracy]")
    assert trained["eval/accuracy"] == metrics["accuracy"]
    assert trained["eval/tool_calls_per_episode"] == metrics["tools/calls_per_episode"]
    assert [s["completion"] for s in samples] == [s["completion"] for s in saved["samples"]]


def test_eval_tool_keys_are_checked_at_start_up(tmp_path):
    from lmrl.config import ConfigError, load_config
    from lmrl.eval.cli import EvalConfig

    with pytest.raises(ConfigError, match="tool_parser"):
        load_config(EvalConfig, None, ["tools=[calculator]", "tool_parser=xml"])
    with pytest.raises(ConfigError, match="win_rate"):
        load_config(EvalConfig, None, ["tools=[calculator]", "metrics=[win_rate]"])
    with pytest.raises(ConfigError, match="chat=false"):
        load_config(EvalConfig, None, ["env=agentic_envs:digits", "chat=false"])
