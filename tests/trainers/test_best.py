"""keep_best=<metric>: best/ holds the model of the best evaluation, besides the newest checkpoints."""

import json

import pytest

from lmrl.models import load_model
from lmrl.tracking import read_jsonl
from lmrl.trainers.best import BestKeeper, is_better, lower_is_better
from lmrl.trainers.sft import trainer as sft
from tests.trainers.test_sft import config


@pytest.mark.parametrize(
    "metric, mode, lower",
    [
        ("eval/accuracy", "auto", False),
        ("eval/metrics/pass@8", "auto", False),
        ("eval/loss", "auto", True),
        ("loss/policy", "auto", True),
        ("eval/ptx_ce", "auto", True),
        ("eval/ce", "auto", True),
        ("eval/loss", "max", False),
        ("eval/accuracy", "min", True),
    ],
)
def test_which_way_is_better(metric, mode, lower):
    assert lower_is_better(metric, mode) is lower


def test_is_better_is_strict_and_never_nan():
    assert is_better(0.5, None, lower=False) and is_better(0.6, 0.5, lower=False)
    assert not is_better(0.5, 0.5, lower=False)  # a tie keeps the earlier step
    assert is_better(0.4, 0.5, lower=True) and not is_better(0.6, 0.5, lower=True)
    assert not is_better(float("nan"), None, lower=False)


def _evals(run_dir):
    return {r["step"]: r["eval/loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "eval/loss" in r}


@pytest.mark.parametrize("mode", ["auto", "max"])
def test_best_holds_the_model_of_the_best_evaluation(tmp_path, mode):
    cfg = config(
        tmp_path,
        "task_args.digits=1",
        "train_rows=64",
        "eval_rows=16",
        "max_steps=6",
        "batch_size=8",
        "lr=3e-3",
        "eval_every=2",
        "save_every=0",
        "log_every=1",
        "keep_best=eval/loss",
        f"keep_best_mode={mode}",
    )
    sft.train(cfg)
    run = tmp_path / "run"
    evals = _evals(run)
    assert sorted(evals) == [0, 2, 4, 6]
    pick = min if mode == "auto" else max  # auto: a loss, lower is better
    step = pick(evals, key=lambda s: (evals[s], s) if mode == "auto" else (evals[s], -s))
    record = json.loads((run / "best" / "best.json").read_text())
    assert record == {"metric": "eval/loss", "value": evals[step], "step": step}
    load_model(str(run / "best"))  # an HF directory, like final/
    assert BestKeeper(run, "eval/loss", mode).value == evals[step]  # a resumed run starts from the record
    assert BestKeeper(run, "eval/accuracy").value is None  # another metric starts afresh


def test_a_metric_the_evaluation_does_not_report_fails_before_training(tmp_path):
    cfg = config(
        tmp_path,
        "task_args.digits=1",
        "train_rows=16",
        "eval_rows=4",
        "max_steps=2",
        "batch_size=4",
        "keep_best=eval/acuracy",
    )
    with pytest.raises(ValueError, match="keep_best='eval/acuracy'.*eval/accuracy"):
        sft.train(cfg)
    assert not (tmp_path / "run" / "best").exists()
