"""The evaluator end to end: scripted generations through the real scoring path, the agreement of `lmrl eval`
with a trainer's own held-out accuracy, reward-model and judge metrics, and bad input at start-up."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from lmrl.cli import main
from lmrl.data.loading import load_rows
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.eval import runner
from lmrl.eval.runner import EvalOptions, Evaluator
from lmrl.models import load_model
from lmrl.models.precision import autocast_dtype
from lmrl.models.reward import RewardModel, load_reward_model
from lmrl.rewards.reward_model import score_texts
from tests.helpers import TINY, TINY_ARGS


@dataclass
class FakeBatch:
    completions: list[str]
    completion_lengths: torch.Tensor


class ScriptedEngine:
    """Stands in for HFEngine: completions per prompt text (ids decoded by the char tokenizer) from a script."""

    script: dict[str, list[str]] = {}

    def __init__(self, model, tokenizer, autocast_dtype=None):
        self.tokenizer, self.device = tokenizer, torch.device("cpu")

    def generate(self, prompt_ids, params, n=1, generator=None):
        out = []
        for ids in prompt_ids:
            question = next(q for q in self.script if q in self.tokenizer.decode(ids))
            answers = self.script[question]
            out += [answers[0]] * n if params.greedy else answers[:n]
        return FakeBatch(out, torch.tensor([len(c) for c in out]))


def test_sampled_metrics_through_the_runner_by_hand(monkeypatch):
    rows = [
        {"prompt": "1+1=", "answer": "2", "task": "arithmetic", "meta": {}},
        {"prompt": "2+5=", "answer": "7", "task": "arithmetic", "meta": {}},
    ]
    ScriptedEngine.script = {
        "1+1=": ["2", "3", "2", "x"],  # c = 2 of 4; votes of the first 3: "2" wins
        "2+5=": ["6", "6", "7", "7"],
    }  # c = 2 of 4; first 3: "6" wins (wrong); 4: tie -> "6"
    monkeypatch.setattr(runner, "HFEngine", ScriptedEngine)
    ev = Evaluator(
        ["accuracy", "pass@1", "pass@2", "pass@4", "maj@3", "maj@4", "avg@4", "pass^2"], rows, EvalOptions(), "rows"
    )
    metrics, samples = ev(model=None, tokenizer=build_char_tokenizer())
    assert metrics["accuracy"] == 0.5  # greedy: "2" right, "6" wrong
    assert metrics["pass@1"] == pytest.approx(0.5)  # c/n = 2/4 for both
    assert metrics["pass@2"] == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2) for both
    assert metrics["pass@4"] == 1.0  # k = n, c > 0
    assert metrics["maj@3"] == 0.5 and metrics["maj@4"] == 0.5
    # per sample index j: A = [(1+0)/2, (0+0)/2, (1+1)/2, (0+1)/2] = [.5, 0, 1, .5]; mean .5; std sqrt(.5/3)
    assert metrics["avg@4"] == pytest.approx(0.5) and metrics["avg@4/std"] == pytest.approx((0.5 / 3) ** 0.5)
    assert metrics["pass^2"] == pytest.approx(1 / 6)  # C(2,2)/C(4,2)
    assert metrics["tokens/generated"] == 2 * 1 + (1 + 1 + 1 + 1) * 2  # greedy 1 char each, then 4 samples each
    assert samples[1]["completion"] == "6" and samples[1]["score"] == 0.0


def test_eval_of_a_checkpoint_agrees_with_the_trainers_held_out_accuracy(tmp_path):
    run = tmp_path / "sft"
    args = [
        "sft",
        "--config",
        "sft/tiny_arithmetic",
        f"output_dir={run}",
        "max_steps=3",
        "eval_every=0",
        "eval_rows=24",
        "num_samples=24",
        "train_rows=256",
        "batch_size=16",
        "lr=3e-3",
        "warmup_steps=1",
        "eval_max_new_tokens=6",
        "precision=fp32",
        *TINY,
    ]
    assert main(args) == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    trainer_acc = [r["eval/accuracy"] for r in records if "eval/accuracy" in r][-1]
    trainer_samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()][-24:]
    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                f"model={run / 'final'}",
                "dataset=task:arithmetic",
                "task_args={digits: 2}",
                "rows=24",
                "max_new_tokens=6",
                "precision=fp32",
                "num_samples=24",
                f"output_file={out}",
                "metrics=[accuracy]",
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["metrics"]["accuracy"] == trainer_acc
    # the same greedy completions row by row (prompt rendering, tokenization and decoding agree)
    assert [s["completion"] for s in result["samples"]] == [s["completion"] for s in trainer_samples]
    assert {"tokens/prompt", "tokens/generated", "tokens/per_prompt"} <= set(result["metrics"])


def test_default_output_goes_to_the_runs_evals_folder(tmp_path, monkeypatch):
    from lmrl.eval.cli import EvalConfig, default_output

    (tmp_path / "run" / "final").mkdir(parents=True)
    assert (
        default_output(EvalConfig(model=str(tmp_path / "run" / "final")))
        == tmp_path / "run" / "evals" / "task_arithmetic.json"
    )
    monkeypatch.chdir(tmp_path)
    assert str(default_output(EvalConfig(model="builtin:tiny", dataset="data/x.jsonl"))) == "evals/data_x.jsonl.json"


def test_reward_metric_is_the_reward_models_mean_score(tmp_path):
    tok = build_char_tokenizer()
    rm = RewardModel(load_model("builtin:tiny", tok, seed=1, model_args=TINY_ARGS), "bt", seed=1)
    rm.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    rows = load_rows("task:arithmetic", split="test", limit=6)
    policy = load_model("builtin:tiny", tok, seed=0, model_args=TINY_ARGS)
    ev = Evaluator(["reward"], rows, EvalOptions(reward_model=str(tmp_path / "rm"), max_new_tokens=5), "rows")
    metrics, samples = ev(policy, tok)
    assert [s["completion"] for s in samples] == [s["completion"] for s in ev(policy, tok)[1]]  # greedy: repeatable
    full = Evaluator(
        ["reward"], rows, EvalOptions(reward_model=str(tmp_path / "rm"), max_new_tokens=5, num_samples=6), "rows"
    )(policy, tok)[1]
    model, rm_tok = load_reward_model(tmp_path / "rm")
    dtype = autocast_dtype("auto", "cpu")  # the reward function's precision (auto: bf16 on AMX CPUs, else fp32)
    expected = score_texts(model, rm_tok, [r["prompt"] for r in rows], [s["completion"] for s in full], dtype=dtype)
    assert [s["reward"] for s in full] == pytest.approx(expected, abs=1e-5)
    assert metrics["reward/mean"] == pytest.approx(sum(expected) / len(expected), abs=1e-5)


def test_judge_win_rate_counts_every_pair(tmp_path):
    rows = load_rows("task:arithmetic", split="test", limit=3)
    tok = build_char_tokenizer()
    policy = load_model("builtin:tiny", tok, seed=0, model_args=TINY_ARGS)
    ev = Evaluator(
        ["win_rate"],
        rows,
        EvalOptions(judge="builtin:tiny", baseline="builtin:tiny", max_new_tokens=4, judge_max_new_tokens=8),
        "rows",
    )
    metrics, samples = ev(policy, tok)
    assert metrics["judge/judged"] + metrics["judge/failures"] == 3  # a random judge rarely writes a verdict tag
    assert metrics["tokens/baseline"] > 0 and metrics["tokens/judge"] > 0
    assert "baseline" in samples[0] and "verdict" in samples[0]


def test_dataset_without_answers_is_a_start_up_error(tmp_path, capsys):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(3)))
    assert main(["eval", f"dataset={data}", "metrics=[accuracy,pass@2]"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "row 0 has no 'answer' column" in out and "answer_column" in out
    assert main(["eval", f"dataset={data}", "metrics=[loglik]"]) == 2
    assert "'choices'" in " ".join(capsys.readouterr().out.split())
    assert main(["eval", "metrics=[pass@k]"]) == 2
    assert "unknown metric 'pass@k'" in " ".join(capsys.readouterr().out.split())
    assert main(["eval", "metrics=[reward]"]) == 2
    assert "reward_model=PATH" in " ".join(capsys.readouterr().out.split())


def test_eval_metrics_in_a_trainer_land_in_metrics_jsonl(tmp_path):
    run = tmp_path / "sft"
    assert (
        main(
            [
                "sft",
                "--config",
                "sft/tiny_arithmetic",
                f"output_dir={run}",
                "max_steps=2",
                "eval_every=0",
                "eval_rows=8",
                "train_rows=64",
                "batch_size=8",
                "precision=fp32",
                "eval_max_new_tokens=4",
                *TINY,
                "eval_metrics=[accuracy,pass@2,maj@2]",
                "eval_metrics_rows=5",
                "eval_metrics_args={max_new_tokens: 4}",
            ]
        )
        == 0
    )
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/metrics/pass@2" in r]
    assert [r["step"] for r in evals] == [0, 2]  # initial and final evaluation
    assert {"eval/metrics/accuracy", "eval/metrics/maj@2", "eval/metrics/tokens/generated"} <= set(evals[-1])
    assert "eval/accuracy" in evals[-1]  # the trainer's own held-out accuracy stays


def test_bad_eval_metrics_stop_a_trainer_before_its_run_dir_exists(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(8)))
    run = tmp_path / "sft"
    assert (
        main(
            [
                "sft",
                f"dataset={data}",
                f"output_dir={run}",
                "max_steps=1",
                "eval_metrics=[accuracy]",
                f"eval_metrics_dataset={data}",
                "precision=fp32",
            ]
        )
        == 2
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "no 'answer' column" in out and not (run / "metrics.jsonl").exists()


def test_training_warns_about_planted_contamination(tmp_path, capsys):
    test_rows = load_rows("task:arithmetic", split="test", limit=20)
    train = [{"prompt": r["prompt"], "completion": r["answer"]} for r in load_rows("task:arithmetic", limit=60)]
    train += [{"prompt": r["prompt"], "completion": r["answer"]} for r in test_rows[:3]]  # planted
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test_rows))
    assert (
        main(
            [
                "sft",
                f"dataset={tmp_path / 'train.jsonl'}",
                f"eval_dataset={tmp_path / 'test.jsonl'}",
                f"output_dir={tmp_path / 'run'}",
                "max_steps=1",
                "batch_size=4",
                "precision=fp32",
                "eval_rows=20",
                *TINY,
                "eval_max_new_tokens=2",
            ]
        )
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: 3 of 20 eval rows" in out and "lmrl decontaminate" in out
