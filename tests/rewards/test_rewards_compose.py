"""Tests of RewardSet: weighted total, metric names, output checks and the failure policy."""

import math

import pytest
import torch

from lmrl.rewards import RewardError, RewardSet

PROMPTS = ["p0", "p1", "p2", "p3"]
COMPLETIONS = ["c0", "c1", "boom", "c3"]


def ones_zeros(prompts, completions, **kwargs):
    return [1.0, 0.0, 1.0, 0.0][: len(completions)]


def mixed(prompts, completions, **kwargs):
    return [0.5, 0.5, -1.0, 2.0][: len(completions)]


def test_weighted_total_components_and_metric_names():
    rs = RewardSet([ones_zeros, mixed], reward_weights=[1.0, 0.2])
    total, components, metrics = rs.compute(PROMPTS, COMPLETIONS)
    # total = 1.0 * a + 0.2 * b = [1 + 0.1, 0 + 0.1, 1 - 0.2, 0 + 0.4] = [1.1, 0.1, 0.8, 0.4]
    torch.testing.assert_close(total, torch.tensor([1.1, 0.1, 0.8, 0.4]), rtol=0, atol=1e-6)
    # components are unweighted
    torch.testing.assert_close(components["mixed"], torch.tensor([0.5, 0.5, -1.0, 2.0]), rtol=0, atol=0)
    assert list(components) == ["ones_zeros", "mixed"]
    assert set(metrics) == {
        "reward/ones_zeros/mean",
        "reward/ones_zeros/std",
        "reward/mixed/mean",
        "reward/mixed/std",
        "reward/mean",
        "reward/std",
        "reward/errors",
    }
    # a: mean 0.5, population std sqrt(4 * 0.25 / 4) = 0.5
    # b: mean (0.5 + 0.5 - 1 + 2)/4 = 0.5; deviations 0, 0, -1.5, 1.5 -> var 4.5/4 = 1.125, std 1.0606602
    # total: mean 2.4/4 = 0.6; deviations .5, -.5, .2, -.2 -> var 0.58/4 = 0.145, std 0.3807887
    expected = {
        "reward/ones_zeros/mean": 0.5,
        "reward/ones_zeros/std": 0.5,
        "reward/mixed/mean": 0.5,
        "reward/mixed/std": math.sqrt(1.125),
        "reward/mean": 0.6,
        "reward/std": math.sqrt(0.145),
        "reward/errors": 0.0,
    }
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key


def test_default_weights_registry_specs_and_options():
    rs = RewardSet(["exact_match", "overlong"], reward_kwargs={"overlong": {"max_len": 10, "cache_len": 4}})
    assert rs.weights == [1.0, 1.0] and rs.names == ["exact_match", "overlong"]
    total, components, _ = rs.compute(
        ["q", "q"], ["7", "8"], answer=["7", "7"], completion_lengths=[3, 8], truncated=[False, False]
    )
    # exact_match [1, 0] + overlong [0, (6 - 8)/4 = -0.5] = [1.0, -0.5]
    torch.testing.assert_close(total, torch.tensor([1.0, -0.5]), rtol=0, atol=1e-7)


def test_last_stats_are_logged_per_reward():
    rs = RewardSet(["math"])
    _, _, metrics = rs.compute(["q", "q"], [r"\boxed{2}", "no idea"], answer=["2", "2"])
    assert metrics["reward/math/mean"] == 0.5
    assert metrics["reward/math/no_answer"] == 1.0 and metrics["reward/math/errors"] == 0.0


def test_tensor_output_is_accepted():
    rs = RewardSet([lambda prompts, completions, **kw: torch.arange(len(completions), dtype=torch.float64)])
    total, _, _ = rs.compute(PROMPTS, COMPLETIONS)
    torch.testing.assert_close(total, torch.tensor([0.0, 1.0, 2.0, 3.0]), rtol=0, atol=0)


def raises_on_boom(prompts, completions, **kwargs):
    return [1.0 / ("boom" not in c) for c in completions]  # ZeroDivisionError on "boom"


def trl_style(completions, **kwargs):
    return [float(len(c)) for c in completions]


def reads_answer(completions, answer, **kw):
    return [float(c == a) for c, a in zip(completions, answer)]


def test_functions_are_called_with_keywords():
    # TRL-style (no prompts), a column by name, and lmrl's (prompts, completions, **columns)
    rs = RewardSet([trl_style, reads_answer, ones_zeros])
    _, components, _ = rs.compute(PROMPTS, COMPLETIONS, answer=["c0", "x", "boom", "y"], truncated=[False] * 4)
    assert components["trl_style"].tolist() == [2.0, 2.0, 4.0, 2.0]
    assert components["reads_answer"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert components["ones_zeros"].tolist() == [1.0, 0.0, 1.0, 0.0]


def test_user_function_by_spec_gets_keywords(tmp_path, monkeypatch):
    (tmp_path / "zz_trl_rewards.py").write_text(
        "def brevity(completions, **kwargs):\n    return [1.0 / (1 + len(c)) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rs = RewardSet(["zz_trl_rewards:brevity"])
    # 1/(1+len): "abc" -> 1/4, "" -> 1
    assert rs.compute(["q", "q"], ["abc", ""]).components["brevity"].tolist() == [0.25, 1.0]


@pytest.mark.parametrize(
    "fn, says",
    [
        (lambda p, c: [0.0] * len(c), "missing a required argument: 'p'"),
        (reads_answer, "missing a required argument: 'answer'"),
    ],
)
def test_a_function_that_cannot_take_the_keywords_is_a_config_error(fn, says):
    with pytest.raises(RewardError) as info:
        RewardSet([fn]).compute(PROMPTS, COMPLETIONS, truncated=[False] * 4)
    err = info.value
    assert err.config_error and not err.skippable and err.sample_index is None
    msg = str(err)
    assert says in msg and "prompts=..., completions=..." in msg and "a column (truncated)" in msg
    assert len(msg.splitlines()) <= 8


def test_a_raising_function_is_reported_with_its_name_and_sample():
    rs = RewardSet([ones_zeros, raises_on_boom])
    with pytest.raises(RewardError) as info:
        rs.compute(PROMPTS, COMPLETIONS)
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.reward, err.sample_index, err.skippable, err.config_error) == ("raises_on_boom", 2, True, False)
    assert (err.prompt, err.completion) == ("p2", "boom")
    msg = str(err)
    assert "'raises_on_boom'" in msg and "sample 2 of 4" in msg and "ZeroDivisionError" in msg
    assert "prompt: 'p2'" in msg and "completion: 'boom'" in msg and "skipped" in msg
    assert len(msg.splitlines()) <= 8
    assert rs.errors == 1
    # The counter shows up in the metrics of the next successful step.
    ok = RewardSet([ones_zeros])
    ok.errors = rs.errors
    assert ok.compute(PROMPTS, COMPLETIONS).metrics["reward/errors"] == 1.0


def test_stop_policy_is_not_skippable():
    rs = RewardSet([raises_on_boom], on_reward_error="stop")
    with pytest.raises(RewardError, match="run stops") as info:
        rs.compute(PROMPTS, COMPLETIONS)
    assert info.value.skippable is False


def test_wrong_length_is_tied_to_the_sample_that_drops_out():
    def drops_boom(prompts, completions, **kwargs):
        return [1.0 for c in completions if c != "boom"]

    with pytest.raises(RewardError) as info:
        RewardSet([drops_boom]).compute(PROMPTS, COMPLETIONS)
    assert info.value.sample_index == 2
    assert "returned 3 values for 4 completions" in str(info.value)
    assert "returned 0 values for 1 completions" in str(info.value)


def test_wrong_length_without_a_culprit_sample():
    def always_one(prompts, completions, **kwargs):
        return [0.0]

    with pytest.raises(RewardError, match="returned 1 values for 4 completions") as info:
        RewardSet([always_one], on_reward_error="stop").compute(PROMPTS, COMPLETIONS)
    assert info.value.sample_index is None
    msg = str(info.value)
    assert "no single sample reproduces it" in msg and "'always_one'" in msg
    assert "Fix: return one finite float per completion" in msg and "run stops" in msg
    assert len(msg.splitlines()) <= 8


def test_long_exception_text_keeps_the_message_short():
    def fn(prompts, completions, **kwargs):
        raise ValueError("line\n" * 200)

    with pytest.raises(RewardError) as info:
        RewardSet([fn]).compute(["p" * 5000] * 2, ["c" * 5000] * 2)
    msg = str(info.value)
    assert len(msg.splitlines()) <= 8 and len(msg) < 1200, msg
    assert "'fn' failed on sample 0 of 2" in msg and "ValueError: line line" in msg and "more chars" in msg


@pytest.mark.parametrize(
    "bad, index, text",
    [
        (float("nan"), 3, "returned nan"),
        (float("inf"), 1, "returned inf"),
        (None, 0, "returned None"),
        ("1", 2, "'1' (str)"),
    ],
)
def test_nan_inf_and_non_numbers_name_the_sample(bad, index, text):
    def fn(prompts, completions, **kwargs):
        out = [0.0] * len(completions)
        out[index] = bad
        return out

    with pytest.raises(RewardError, match=rf"failed on sample {index} of 4") as info:
        RewardSet([fn]).compute(PROMPTS, COMPLETIONS)
    assert text in str(info.value) and info.value.completion == COMPLETIONS[index]


def test_two_dimensional_output_is_rejected():
    def fn(prompts, completions, **kwargs):
        return torch.zeros(len(completions), 1)

    with pytest.raises(RewardError, match=r"shape \(4, 1\), expected \(4,\)"):
        RewardSet([fn]).compute(PROMPTS, COMPLETIONS)


def test_missing_column_is_a_config_error_that_always_stops():
    rs = RewardSet(["exact_match"], on_reward_error="skip")
    with pytest.raises(RewardError, match="configuration error") as info:
        rs.compute(PROMPTS, COMPLETIONS)
    assert info.value.config_error and not info.value.skippable
    assert "'answer'" in str(info.value)


def test_long_texts_are_truncated_in_the_message():
    long = "x" * 1000

    def fn(prompts, completions, **kwargs):
        raise RuntimeError("bad")

    with pytest.raises(RewardError) as info:
        RewardSet([fn]).compute([long], [long])
    assert "900 more chars" in str(info.value) and "x" * 101 not in str(info.value)  # cut to 100 chars
    assert len(str(info.value).splitlines()) <= 8
    assert info.value.completion == long  # the attribute keeps the full text


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rewards": []}, "non-empty list"),
        ({"rewards": "math"}, "non-empty list"),
        ({"rewards": ["math", "format"], "reward_weights": [1.0]}, "one number per reward"),
        ({"rewards": ["math"], "reward_weights": [float("nan")]}, "finite number"),
        ({"rewards": ["math"], "on_reward_error": "ignore"}, "on_reward_error"),
        ({"rewards": ["math"], "reward_kwargs": {"overlong": {"max_len": 4}}}, "not in `rewards`"),
        ({"rewards": ["math", "math"]}, "unique"),
        ({"rewards": ["math", 3]}, "spec string or a callable"),
    ],
)
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardSet(**kwargs)


def test_bad_batches():
    rs = RewardSet([ones_zeros])
    with pytest.raises(ValueError, match="3 prompts and 4 completions"):
        rs.compute(PROMPTS[:3], COMPLETIONS)
    with pytest.raises(ValueError, match="column 'answer' must hold one value per completion"):
        rs.compute(PROMPTS, COMPLETIONS, answer=["1"])


def test_max_skipped_steps_failures_in_a_row_stop_and_a_success_resets_the_count():
    up = {"now": False}

    def flaky(prompts, completions, **kwargs):
        if up["now"]:
            return [1.0] * len(completions)
        raise RuntimeError("down")

    rs = RewardSet([flaky], on_reward_error="skip", max_skipped_steps=2)
    outcomes = []
    for call in range(5):
        up["now"] = call == 2  # the third call succeeds
        try:
            rs.compute(PROMPTS, COMPLETIONS)
            outcomes.append("ok")
        except RewardError as err:
            outcomes.append("skip" if err.skippable else "stop")
            if not err.skippable:
                assert "2 steps in a row" in str(err) and "max_skipped_steps" in str(err)
    assert outcomes == ["skip", "stop", "ok", "skip", "stop"]


def test_a_reward_that_calls_sys_exit_stops_the_run_with_a_message():
    def quits(prompts, completions, **kwargs):
        raise SystemExit(0)

    with pytest.raises(RewardError, match=r"(?s)called sys.exit\(0\).*return a reward") as info:
        RewardSet([quits], on_reward_error="skip").compute(PROMPTS, COMPLETIONS)
    assert not info.value.skippable  # no retry fixes it: the run stops, naming the function
