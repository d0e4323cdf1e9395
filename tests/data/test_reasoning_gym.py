"""reasoning-gym datasets as lmrl tasks: rows, disjoint splits, weighted mixes, their verifiers through get_task,
single draws for the swarm, `lmrl rl dataset=rg:...` end to end, and unknown names refused with a suggestion."""

import json
import random

import pytest

pytest.importorskip("reasoning_gym")

from lmrl.data.loading import load_rows  # noqa: E402
from lmrl.data.tasks import get_task  # noqa: E402
from tests.helpers import TINY


def test_rows_carry_the_verifier_and_the_splits_are_disjoint():
    train = load_rows("rg:chain_sum", split="train", limit=60, min_terms=2, max_terms=2)
    test = load_rows("rg:chain_sum", split="test", limit=10, min_terms=2, max_terms=2)
    assert len(train) == 60 and len(test) == 10
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    row = train[0]
    assert row["task"] == "rg:chain_sum" and row["completion"] == row["answer"]
    json.dumps(row)  # JSON-safe: rows travel in files and swarm payloads
    task = get_task(row["task"])
    assert task.score(row["answer"], row["answer"], row["meta"]) == 1.0
    assert task.score(f"<answer>{row['answer']}</answer>", row["answer"], row["meta"]) == 1.0
    assert task.score(str(int(row["answer"]) + 1), row["answer"], row["meta"]) == 0.0
    assert task.score(None, row["answer"], row["meta"]) == 0.0  # never raises
    assert load_rows("rg:chain_sum", split="train", limit=60, min_terms=2, max_terms=2) == train  # deterministic


def test_a_weighted_mix_draws_from_each_dataset_by_weight():
    rows = load_rows("rg:chain_sum+basic_arithmetic", split="train", limit=400, weights={"chain_sum": 3})
    share = sum(r["task"] == "rg:chain_sum" for r in rows) / len(rows)
    assert 0.65 < share < 0.85  # 3/4 expected; binomial std over 400 draws ~0.02
    for r in rows[:20]:
        assert get_task(r["task"]).score(r["answer"], r["answer"], r["meta"]) == 1.0
    with pytest.raises(ValueError, match="one config per dataset"):
        load_rows("rg:chain_sum+basic_arithmetic", limit=4, min_terms=2)


def test_single_draws_for_the_swarm_are_seeded():
    task = get_task("rg:chain_sum", min_terms=2, max_terms=2)
    a, b = task.sample(random.Random(5)), task.sample(random.Random(5))
    assert a == b and a.meta["num_terms"] == 2 and task.score(a.answer, a.answer, a.meta) == 1.0


def test_unknown_datasets_are_named_with_a_suggestion():
    with pytest.raises(ValueError, match="did you mean 'chain_sum'"):
        load_rows("rg:chainsum", limit=2)
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset"):  # e.g. a swarm peer's row: dropped
        get_task("rg:no_such_task")


def test_rl_runs_on_a_reasoning_gym_task_with_its_verifier(tmp_path):
    from lmrl.config import load_config
    from lmrl.tracking import read_jsonl
    from lmrl.trainers.rl import trainer as online

    online.train(
        load_config(
            online.RLConfig,
            None,
            [
                f"output_dir={tmp_path}",
                "dataset=rg:chain_sum",
                "task_args={min_terms: 2, max_terms: 2}",
                "precision=fp32",
                *TINY,
                "train_rows=32",
                "eval_rows=8",
                "prompts_per_step=2",
                "samples_per_prompt=2",
                "max_new_tokens=4",
                "max_steps=2",
                "eval_every=2",
                "save_every=0",
                "log_every=1",
                "rewards=[task]",
            ],
        )
    )
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert "eval/accuracy" in rows[0] and [r["step"] for r in rows if "reward/task/mean" in r] == [1, 2]
