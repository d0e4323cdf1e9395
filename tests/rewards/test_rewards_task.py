"""Tests of the `task` reward over the built-in task checkers (lmrl.data.tasks)."""

import json

import pytest

import lmrl.data.tasks as tasks
from lmrl.rewards import MissingColumnError, RewardError, RewardSet, make_reward

COUNTDOWN_META = {"numbers": [2, 3, 4], "target": 14}


def test_task_reward_uses_the_builtin_checkers_with_dict_or_json_meta():
    completions = ["<answer>46</answer>", "45", "3*4+2", "7*2", "3*4+2=14"]
    columns = {
        "task": ["arithmetic", "arithmetic", "countdown", "countdown", "countdown"],
        "answer": ["46", "46", "3*4+2", "3*4+2", "3*4+2"],
        "meta": [{"expression": "12+34"}, "", json.dumps(COUNTDOWN_META), COUNTDOWN_META, json.dumps(COUNTDOWN_META)],
        "truncated": [False] * 5,
        "completion_lengths": [5] * 5,
    }
    # arithmetic 12+34: "46" in <answer> -> 1; "45" -> 0
    # countdown make 14 from 2 3 4: 3*4+2 = 14 -> 1 (meta from JSON); 7*2 uses a 7 -> 0; "3*4+2=14" -> 1
    assert make_reward("task")(["p"] * 5, completions, **columns) == [1.0, 0.0, 1.0, 0.0, 1.0]


def test_meta_reaches_the_checker():
    # Countdown needs meta["numbers"] and meta["target"]: with no meta its checker fails and scores 0.
    fn = make_reward("task")
    with_meta = fn(["p"], ["3*4+2"], task=["countdown"], answer=["3*4+2"], meta=[COUNTDOWN_META])
    without_meta = fn(["p"], ["3*4+2"], task=["countdown"], answer=["3*4+2"])
    assert (with_meta, without_meta) == ([1.0], [0.0])


def test_task_objects_are_cached_by_name(monkeypatch):
    calls = []
    real = tasks.get_task

    def counting(name, **kwargs):
        calls.append(name)
        return real(name, **kwargs)

    monkeypatch.setattr(tasks, "get_task", counting)
    fn = make_reward("task")
    for _ in range(2):
        fn(["p"] * 3, ["1", "2", "3"], task=["arithmetic", "countdown", "arithmetic"], answer=["1", "2", "3"])
    assert sorted(calls) == ["arithmetic", "countdown"]  # once per name over both calls


def test_task_option_for_datasets_without_a_task_column():
    fn = make_reward("task", task="arithmetic")
    assert fn(["p", "p"], ["46", "7"], answer=["46", "46"]) == [1.0, 0.0]
    with pytest.raises(MissingColumnError, match="'task'.*reward_kwargs.task.task"):
        make_reward("task")(["p"], ["46"], answer=["46"])
    with pytest.raises(MissingColumnError, match="'answer'"):
        fn(["p"], ["46"])
    with pytest.raises(ValueError, match="must be a task name"):
        make_reward("task", task="")


def test_bad_meta_and_unknown_task_are_reported_per_sample():
    rs = RewardSet(["task"])
    with pytest.raises(RewardError, match=r"'task' failed on sample 1 of 2.*not valid JSON") as info:
        rs.compute(["p", "p"], ["46", "46"], task=["arithmetic"] * 2, answer=["46"] * 2, meta=["{}", "{oops"])
    assert info.value.sample_index == 1
    with pytest.raises(RewardError, match=r"failed on sample 0 of 1.*unknown task 'arithmatic'"):
        rs.compute(["p"], ["46"], task=["arithmatic"], answer=["46"])
