"""lm-evaluation-harness evaluates an lmrl checkpoint on a tiny local task made here (no downloads), and its
per-choice log-likelihoods equal lmrl's own `loglik` evaluation of the same rows."""

from __future__ import annotations

import json
import os

import pytest

from lmrl.cli import main
from lmrl.data.chat import encode_prompt
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.eval.harness import flat_metrics, run_harness, write_task
from lmrl.eval.loglik import choice_logprobs
from lmrl.models import load_model, save_model
from tests.helpers import TINY_ARGS

lm_eval = (
    pytest.importorskip("lm_eval", reason="the eval extra (pip install -e '.[eval]')")
    if not os.environ.get("CI")
    else __import__("lm_eval")
)

ROWS = [
    {"prompt": "2+3=", "choices": ["5", "6", "7"], "answer": 0},
    {"prompt": "4+4=", "choices": ["7", "8", "19"], "answer": 1},
    {"prompt": "9-1=", "choices": ["8", "10"], "answer": 0},
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "final"
    tok = build_char_tokenizer()
    save_model(load_model("builtin:tiny", tok, seed=3, model_args=TINY_ARGS), tok, path)
    return path


@pytest.mark.slow  # ~13 s: lm-evaluation-harness's own model loading
def test_harness_loglikelihoods_equal_lmrls(checkpoint, tmp_path):
    write_task(tmp_path / "tasks", "lmrl_tiny_mc", ROWS)
    result = run_harness(str(checkpoint), ["lmrl_tiny_mc"], str(tmp_path / "tasks"), log_samples=True)
    metrics = flat_metrics(result)
    assert set(metrics) >= {"harness/lmrl_tiny_mc/acc", "harness/lmrl_tiny_mc/acc_norm"}
    tok = build_char_tokenizer()
    model = load_model(str(checkpoint), tok).eval()
    picks = []
    for sample in result["samples"]["lmrl_tiny_mc"]:
        row = ROWS[sample["doc_id"]]
        harness = [resp[0][0] for resp in sample["resps"]]  # (loglikelihood, is_greedy) per choice
        ours, _ = choice_logprobs(model, tok, encode_prompt(tok, row["prompt"], chat=False), row["choices"])
        assert harness == pytest.approx(ours, abs=1e-4)
        picks.append(max(range(len(ours)), key=lambda i: ours[i]) == row["answer"])
    assert metrics["harness/lmrl_tiny_mc/acc"] == pytest.approx(sum(picks) / len(picks))


@pytest.mark.slow  # about a minute: the harness run again behind `lmrl eval`
def test_lmrl_eval_runs_harness_tasks(checkpoint, tmp_path):
    write_task(tmp_path / "tasks", "lmrl_tiny_mc", ROWS)
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                f"model={checkpoint}",
                f"dataset={data}",
                "metrics=[loglik]",
                "chat=false",
                "harness_tasks=[lmrl_tiny_mc]",
                f"harness_include={tmp_path / 'tasks'}",
                "precision=fp32",
                f"output_file={out}",
            ]
        )
        == 0
    )
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["loglik/acc"] == pytest.approx(metrics["harness/lmrl_tiny_mc/acc"])


def test_harness_errors_are_clear(tmp_path, capsys):
    assert main(["eval", "model=builtin:tiny", "harness_tasks=[x]", "metrics=[]"]) == 2
    assert "not a local HF model directory" in " ".join(capsys.readouterr().out.split())
