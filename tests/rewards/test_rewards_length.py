"""Tests of the `overlong` (DAPO soft overlong punishment) and `length` rewards."""

import pytest

from lmrl.rewards import MissingColumnError, make_reward, overlong_penalty


def test_overlong_three_regions_by_hand():
    # L_max = 10, L_cache = 4, so the threshold L_max - L_cache = 6.
    #   L <= 6:        0                       (L = 0, 6)
    #   6 < L <= 10:   (6 - L) / 4             L=7: -0.25, L=8: -0.5, L=10: -1.0
    #   L > 10:        -1                      (L = 11, 100)
    fn = make_reward("overlong", max_len=10, cache_len=4)
    lengths = [0, 6, 7, 8, 10, 11, 100]
    out = fn(["q"] * 7, ["c"] * 7, completion_lengths=lengths)
    assert out == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0], abs=1e-12)


def test_overlong_dapo_scale():
    # DAPO: L_max = 20480, L_cache = 4096 -> threshold 16384; L = 18432 gives (16384 - 18432)/4096 = -0.5
    assert overlong_penalty(18432, 20480, 4096) == pytest.approx(-0.5, abs=1e-12)
    assert overlong_penalty(16384, 20480, 4096) == 0.0
    assert overlong_penalty(16385, 20480, 4096) == pytest.approx(-1 / 4096, abs=1e-15)


def test_overlong_options_and_column_are_checked():
    for bad in [{}, {"max_len": 10}, {"max_len": 10, "cache_len": 0}, {"max_len": 10, "cache_len": 11}]:
        with pytest.raises(ValueError, match="0 < cache_len <= max_len"):
            make_reward("overlong", **bad)
    with pytest.raises(MissingColumnError, match="completion_lengths"):
        make_reward("overlong", max_len=10, cache_len=4)(["q"], ["c"])


def test_length_penalty_per_token():
    # coef 0.01: L=0 -> 0, L=50 -> -0.5, L=120 -> -1.2
    fn = make_reward("length", coef=0.01)
    assert fn(["q"] * 3, ["c"] * 3, completion_lengths=[0, 50, 120]) == pytest.approx([0.0, -0.5, -1.2], abs=1e-12)
    # default coef 0.001: L=100 -> -0.1
    assert make_reward("length")(["q"], ["c"], completion_lengths=[100]) == pytest.approx([-0.1], abs=1e-12)


def test_length_target():
    # target 100: r = max(-1, -|L-100|/100)
    #   L=100 -> 0; L=50 -> -0.5; L=150 -> -0.5; L=130 -> -0.3; L=0 -> -1; L=300 -> max(-1, -2) = -1
    fn = make_reward("length", mode="target", target=100)
    lengths = [100, 50, 150, 130, 0, 300]
    out = fn(["q"] * 6, ["c"] * 6, completion_lengths=lengths)
    assert out == pytest.approx([0.0, -0.5, -0.5, -0.3, -1.0, -1.0], abs=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "target"}, "positive integer target"),
        ({"mode": "target", "target": 100, "coef": 0.1}, "no coef"),
        ({"target": 100}, "no target"),
        ({"coef": -0.1}, "coef >= 0"),
        ({"coef": float("nan")}, "finite coef"),
        ({"mode": "linear"}, "'penalty' or 'target'"),
    ],
)
def test_length_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_reward("length", **kwargs)
