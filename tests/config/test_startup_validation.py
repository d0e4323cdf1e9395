"""Bad input that used to fail only after the model loaded (or with a traceback) fails in the config layer."""

import dataclasses
import importlib
import re
import typing

import pytest

from lmrl import cli
from lmrl.config import ConfigError, Section, from_dict
from tests.helpers import ONE_LAYER

COUNT_KEYS = [
    (verb, f.name)
    for verb, v in cli.VERBS.items()
    for f in dataclasses.fields(getattr(importlib.import_module(v.module), v.config))
    if f.name.endswith(("batch_size", "_per_step", "_per_prompt")) and f.type in ("int", int)
]


def config_class(verb):
    v = cli.VERBS[verb]
    return getattr(importlib.import_module(v.module), v.config)


@pytest.mark.parametrize("verb, key", COUNT_KEYS, ids=[f"{v}-{k}" for v, k in COUNT_KEYS])
def test_zero_counts_fail_in_the_config(verb, key):
    with pytest.raises(ConfigError, match=f"'{key}' must be >= 1"):
        from_dict(config_class(verb), {key: 0})


def test_every_batch_size_key_is_covered():
    assert {"sft", "reward", "dpo", "pretrain", "rejection-sampling"} <= {v for v, k in COUNT_KEYS if k == "batch_size"}


@pytest.mark.parametrize("verb", ["sft", "rl", "dpo"])
def test_output_dir_that_is_or_is_under_a_file_fails_in_the_config(tmp_path, verb):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        from_dict(config_class(verb), {"output_dir": str(afile)})
    with pytest.raises(ConfigError, match="is under the file"):
        from_dict(config_class(verb), {"output_dir": str(afile / "run")})


def test_bad_task_args_are_a_clear_error_not_a_traceback(tmp_path, capsys):
    assert (
        cli.main(
            [
                "sft",
                "task_args.digits=abc",
                f"output_dir={tmp_path / 'run'}",
                "max_steps=1",
                *ONE_LAYER,
            ]
        )
        == 2
    )
    out = capsys.readouterr().out
    assert "task_args.digits" in out and "must be an integer" in out
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


TEMPERATURE_VERBS = [
    verb
    for verb, v in cli.VERBS.items()
    if verb != "generate"  # generate: 0 means greedy
    and "temperature" in {f.name for f in dataclasses.fields(config_class(verb))}
]


@pytest.mark.parametrize("verb", TEMPERATURE_VERBS)
def test_non_positive_temperature_fails_in_the_config(verb):
    for value in (0, -1.0):
        with pytest.raises(ConfigError, match="'temperature' must be > 0"):
            from_dict(config_class(verb), {"temperature": value})


def test_grpo_with_one_sample_per_prompt_fails_in_the_config():
    with pytest.raises(ConfigError, match="samples_per_prompt >= 2"):
        from_dict(config_class("rl"), {"algorithm": "grpo", "samples_per_prompt": 1})


def float_keys(verb):
    """The keys of ``verb`` that take a float: float, float | None, list[float]."""
    cls = config_class(verb)
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if "float" in str(hints[f.name])]


FLOAT_KEYS = [(verb, key) for verb in cli.VERBS for key in float_keys(verb)]


@pytest.mark.parametrize("verb, key", FLOAT_KEYS, ids=[f"{v}-{k}" for v, k in FLOAT_KEYS])
def test_nan_and_inf_fail_in_the_config_for_every_float_key(verb, key):
    """main: kl_coef=nan trained with no KL; lr/max_grad_norm/temperature=nan|inf failed later, naming no key."""
    is_list = str(typing.get_type_hints(config_class(verb))[key]).startswith("list")
    for value in ("nan", float("inf"), float("-inf")):
        with pytest.raises(ConfigError, match=re.escape(f"'{key}{'[0]' if is_list else ''}' must be a finite number")):
            from_dict(config_class(verb), {key: [value] if is_list else value})


def test_every_float_key_of_the_issue_is_covered():
    assert {("rl", "kl_coef"), ("sft", "lr"), ("sft", "max_grad_norm"), ("rl", "temperature")} <= set(FLOAT_KEYS)


def test_nan_in_a_config_built_in_python_names_the_key():
    with pytest.raises(ConfigError, match="'lr' must be a finite number"):
        config_class("sft")(lr=float("nan"))


TRAIN_ROWS_VERBS = [
    verb
    for verb in cli.VERBS
    if "train_rows" in {f.name for f in dataclasses.fields(config_class(verb))}
    and issubclass(config_class(verb), Section)
]


@pytest.mark.parametrize("verb", TRAIN_ROWS_VERBS)
def test_zero_train_rows_names_the_key(verb):
    with pytest.raises(ConfigError, match=r"'train_rows' must be >= 1 \(or null: every row\), got 0"):
        from_dict(config_class(verb), {"train_rows": 0})  # main: "limit must be >= 1 or None, got 0."


def test_the_lmrl_command_imports_modules_from_the_current_folder(tmp_path, monkeypatch):
    """`lmrl rl rewards=[my_rewards:f]` run from the folder holding my_rewards.py finds it, as `python -m lmrl` does
    (the console script's sys.path starts with its own folder)."""
    import sys

    from lmrl import cli
    from lmrl.rewards.registry import load_reward

    (tmp_path / "my_rewards_here.py").write_text(
        "def f(prompts, completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(ValueError, match="no module named 'my_rewards_here'"):
        load_reward("my_rewards_here:f")
    cli.use_working_directory()
    assert load_reward("my_rewards_here:f")(["p"], ["c"]) == [1.0]
