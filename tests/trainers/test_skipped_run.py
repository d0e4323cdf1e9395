"""A run whose every step a failing reward skipped trained nothing: it stops with a message and no final/ (issue 33),
also when it is shorter than max_skipped_steps."""

import pytest

from lmrl import cli
from lmrl.trainers import common, loop
from tests.helpers import TINY, register_once


def always_raises(prompts, completions, **kwargs):
    raise RuntimeError("boom")


register_once("test_always_raises", always_raises)


def test_a_run_shorter_than_max_skipped_steps_with_a_failing_reward_fails(tmp_path, capsys):
    args = [
        "rl",
        f"output_dir={tmp_path / 'run'}",
        "precision=fp32",
        *TINY,
        "task_args.digits=1",
        "train_rows=8",
        "eval_rows=2",
        "prompts_per_step=2",
        "samples_per_prompt=2",
        "max_new_tokens=2",
        "eval_every=0",
        "rewards=[test_always_raises]",
        "max_steps=2",
    ]  # the default max_skipped_steps: 10
    assert cli.main(args) == 1  # was: exit 0 and final/ "trained" by 0 updates
    assert not (tmp_path / "run" / "final").exists()
    out = capsys.readouterr().out
    assert "every one of the 2 steps" in out and "no final/ model" in out


def test_check_trained_lets_a_run_with_one_trained_step_finish():
    loop.check_trained(skipped=2, steps=3)
    loop.check_trained(skipped=0, steps=0)  # resumed at max_steps: nothing to run
    with pytest.raises(common.TrainingStopped, match="every one of the 3 steps"):
        loop.check_trained(skipped=3, steps=3)
