"""Tests of the reward registry: names, options, user functions as 'module:function'."""

import sys

import pytest

from lmrl.rewards import REWARDS, load_reward, make_reward, register_reward, reward_name


def test_builtins_are_registered():
    assert {"task", "math", "exact_match", "format", "length", "overlong"} <= set(REWARDS)


def test_unknown_name_and_bad_options_are_clear():
    with pytest.raises(ValueError, match=r"Unknown reward 'mth'.*'math'"):
        make_reward("mth")
    with pytest.raises(ValueError, match=r"Bad options for reward 'format'.*pattern="):
        make_reward("format", patern="x")


def test_register_refuses_a_taken_name(monkeypatch):
    def factory():
        return lambda prompts, completions, **kw: [0.0] * len(completions)

    monkeypatch.setitem(REWARDS, "zz_test_reward", factory)
    assert register_reward("zz_test_reward")(factory) is factory  # same factory again: fine
    with pytest.raises(ValueError, match="already registered"):
        register_reward("zz_test_reward")(lambda: None)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    pkg = tmp_path / "zz_user_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "my_rewards.py").write_text(
        "def brevity(prompts, completions, **kwargs):\n"
        "    return [1.0 / (1 + len(c)) for c in completions]\n"
        "NOT_CALLABLE = 3\n"
    )
    (pkg / "broken.py").write_text("import zz_no_such_dependency\n")
    (pkg / "raising.py").write_text("raise RuntimeError('config file missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "zz_user_pkg"
    for name in [m for m in sys.modules if m.startswith("zz_user_pkg")]:
        del sys.modules[name]


def test_load_user_function(user_module):
    fn = load_reward(f"{user_module}.my_rewards:brevity")
    # 1/(1+len): "abc" -> 1/4, "" -> 1
    assert fn(["q", "q"], ["abc", ""]) == [0.25, 1.0]
    assert reward_name(f"{user_module}.my_rewards:brevity") == "brevity"


def test_load_user_function_errors_name_module_and_function(user_module):
    with pytest.raises(ValueError, match=r"no module named 'zz_user_pkg.nope'.*function 'brevity'.*PYTHONPATH"):
        load_reward(f"{user_module}.nope:brevity")
    with pytest.raises(ValueError, match=r"module 'zz_user_pkg.my_rewards'.*no attribute 'brevty'.*'brevity'"):
        load_reward(f"{user_module}.my_rewards:brevty")
    with pytest.raises(ValueError, match=r"is not callable \(it is of type int\)"):
        load_reward(f"{user_module}.my_rewards:NOT_CALLABLE")
    with pytest.raises(ValueError, match="imports a missing module.*zz_no_such_dependency"):
        load_reward(f"{user_module}.broken:f")
    with pytest.raises(ValueError, match="raised RuntimeError: config file missing"):
        load_reward(f"{user_module}.raising:f")
    with pytest.raises(ValueError, match="takes no options"):
        load_reward(f"{user_module}.my_rewards:brevity", scale=2)


def test_unknown_spec_lists_what_is_accepted():
    for spec in ["not a spec", "mod:", "model"]:
        with pytest.raises(ValueError, match=r"Unknown reward spec.*registered name.*'module.path:function'"):
            load_reward(spec)
    with pytest.raises(ValueError, match="must be a string"):
        load_reward(3)


def test_model_spec_names_a_missing_reward_model(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Reward model '.*nowhere' does not exist.*lmrl reward"):
        load_reward(f"model:{tmp_path / 'nowhere'}")
    assert reward_name("model:runs/reward/final") == "reward_model"


def test_load_registry_name_with_options():
    fn = load_reward("overlong", max_len=10, cache_len=4)
    assert fn(["q"], ["c"], completion_lengths=[8]) == [-0.5]  # (6 - 8) / 4
    assert reward_name("overlong") == "overlong"
    assert reward_name(fn) == "overlong"
