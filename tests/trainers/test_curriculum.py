"""The online difficulty curriculum: the plain data order when nothing sits out, out-of-range prompts skipped for
exactly the next epochs, never stuck, exact resume."""

from lmrl.trainers import common
from lmrl.trainers.rl.curriculum import Curriculum


def test_without_sit_outs_the_batches_are_the_plain_data_order():
    cur = Curriculum(num_rows=10, seed=3, lo=0.0, hi=1.0)
    for step in range(1, 8):  # 4 rows a step: batches cross epoch boundaries
        assert cur.next_batch(4) == common.epoch_batch_indices(10, 4, step, 3)


def test_out_of_range_prompts_sit_out_the_next_epoch_then_return():
    cur = Curriculum(num_rows=6, seed=0, lo=0.2, hi=0.8, sit_out=1)
    first = cur.next_batch(6)  # epoch 0, every row once
    cur.record(first, [1.0, 0.0, 0.5, 0.5, 0.5, 0.5])  # rows first[0] (always solved) and first[1] (never) go out
    assert cur.metrics()["rollout/curriculum_sitting_out"] == 2
    second = cur.next_batch(4)  # epoch 1 without them: the 4 in-range rows
    assert sorted(second) == sorted(first[2:]) and cur.metrics()["rollout/curriculum_skipped"] == 2
    third = cur.next_batch(6)  # epoch 2: everyone is back
    assert sorted(third) == sorted(first)


def test_a_prompt_back_in_range_is_released():
    cur = Curriculum(num_rows=4, seed=0, lo=0.2, hi=0.8, sit_out=5)
    rows = cur.next_batch(4)
    cur.record(rows, [0.0, 0.5, 0.5, 0.5])
    cur.record(rows[:1], [0.5])  # measured again in range (e.g. by an evaluation): no longer sitting out
    assert cur.metrics()["rollout/curriculum_sitting_out"] == 0


def test_when_every_prompt_is_out_of_range_training_goes_on_with_all():
    cur = Curriculum(num_rows=3, seed=0, lo=0.2, hi=0.8)
    rows = cur.next_batch(3)
    cur.record(rows, [0.0, 0.0, 1.0])
    assert len(cur.next_batch(3)) == 3


def test_state_round_trip_resumes_the_same_batches():
    a = Curriculum(num_rows=7, seed=1, lo=0.2, hi=0.8)
    rows = a.next_batch(5)
    a.record(rows, [0.0, 0.5, 1.0, 0.5, 0.5])
    b = Curriculum(num_rows=7, seed=1, lo=0.2, hi=0.8)
    b.load_state_dict(a.state_dict())
    assert [a.next_batch(3) for _ in range(4)] == [b.next_batch(3) for _ in range(4)]


def test_rl_with_a_curriculum_logs_it_and_resumes_exactly(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_online import rl_config  # noqa: E402 - the online tests' tiny dense-reward setup

    from lmrl.tracking import read_jsonl
    from lmrl.trainers.rl import trainer as online

    args = ["train_rows=8", "prompts_per_step=2", "curriculum=[0.3, 1.0]", "save_every=2", "keep_checkpoints=5"]
    online.train(rl_config(tmp_path / "full", "grpo", *args, "max_steps=4"))
    online.train(rl_config(tmp_path / "half", "grpo", *args, "max_steps=2"))
    online.train(rl_config(tmp_path / "half", "grpo", *args, "max_steps=4", "resume=true"))
    full, half = (read_jsonl(tmp_path / d / "grpo" / "metrics.jsonl") for d in ("full", "half"))
    steps = [r for r in full if r["step"] > 0 and "reward/mean" in r]
    assert all("rollout/curriculum_sitting_out" in r for r in steps)
    assert sum(r["rollout/curriculum_sitting_out"] for r in steps) > 0  # the random model's digit share is mostly < 0.3
    resumed = {r["step"]: r for r in half if r["step"] > 2 and "reward/mean" in r}
    for r in steps[2:]:
        assert resumed[r["step"]]["reward/mean"] == r["reward/mean"]
        assert resumed[r["step"]]["rollout/curriculum_skipped"] == r["rollout/curriculum_skipped"]
