"""A user environment that breaks the protocol fails at its first call with a message naming the environment and
the contract (issue 33), not a traceback deep in the rollout."""

import pytest

from lmrl.rollout.tools.env import CheckedEnv, StepResult, checked_factory


class Good:
    tools: list = []
    stats = {"calls": 0}

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, message):
        return StepResult([], 1.0, True)


class TupleStep(Good):
    def step(self, message):
        return [], 1.0, True


class StringReset(Good):
    def reset(self, row):
        return row["prompt"]


class NoTools:
    def reset(self, row):
        return [{"role": "user", "content": "hi"}]


def test_a_conforming_environment_passes_through():
    env = checked_factory(lambda row: Good(), "mine:make")({"prompt": "1+1"})
    assert env.reset({"prompt": "1+1"}) == [{"role": "user", "content": "1+1"}]
    assert env.step({"role": "assistant", "content": "2"}).done and env.stats == {"calls": 0} and env.tools == []


@pytest.mark.parametrize(
    ("cls", "call", "contract"),
    [
        (TupleStep, "step", "must return a StepResult"),
        (StringReset, "reset", "non-empty list of messages"),
        (NoTools, "init", "must be a list of tool schemas"),
    ],
)
def test_broken_environments_name_themselves_and_the_contract(cls, call, contract):
    with pytest.raises(ValueError, match=contract) as err:
        env = CheckedEnv(cls(), "mine:make")
        env.reset({"prompt": "hi"}) if call == "reset" else env.step({"role": "assistant", "content": "x"})
    assert "env=mine:make" in str(err.value) and "Environment protocol" in str(err.value)
