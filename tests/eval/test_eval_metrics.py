"""The evaluation formulas against values computed by hand."""

from __future__ import annotations

import math
from itertools import combinations

import pytest

from lmrl.eval.metrics import (
    avg_at_k,
    choose,
    lc_win_rate,
    maj_at_k,
    majority_answer,
    pass_at_k,
    pass_hat_k,
    win_rate,
)
from lmrl.eval.spec import parse_metrics


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 2 / 5),  # one draw: c/n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (5, 0, 3, 0.0),  # c = 0: never
        (5, 5, 5, 1.0),  # k = n with every sample right
        (5, 1, 5, 1.0),  # k = n: the one right sample is always drawn
        (6, 2, 5, 1.0),  # n - c < k: a right one is always drawn
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_enumeration_of_subsets():
    samples = [1, 0, 0, 1, 0, 0, 0]
    for k in range(1, len(samples) + 1):
        subsets = list(combinations(samples, k))
        assert pass_at_k(len(samples), sum(samples), k) == pytest.approx(
            sum(any(s) for s in subsets) / len(subsets), abs=1e-12
        )
        assert pass_hat_k(len(samples), sum(samples), k) == pytest.approx(
            sum(all(s) for s in subsets) / len(subsets), abs=1e-12
        )


@pytest.mark.parametrize(
    "n, c, k, expected", [(5, 2, 2, 1 / 10), (5, 5, 5, 1.0), (5, 4, 5, 0.0), (4, 0, 1, 0.0), (4, 3, 2, 3 / 6)]
)
def test_pass_hat_k_by_hand(n, c, k, expected):
    assert pass_hat_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_k_over_n():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


def test_majority_vote_by_hand():
    assert majority_answer(["3", "4", "4", None, None, None]) == "4"  # None never votes
    assert majority_answer(["5", "6", "6", "5"]) == "5"  # tie: the first to appear
    assert majority_answer([None, None]) is None
    answers = ["7", "8", "8", "7", "7"]
    right = [a == "7" for a in answers]
    assert maj_at_k(answers, right, 1) == 1.0  # first sample only: "7", right
    assert maj_at_k(answers, right, 3) == 0.0  # 7, 8, 8 -> "8", wrong
    assert maj_at_k(answers, right, 4) == 1.0  # 7, 8, 8, 7: tie, first seen "7"
    assert maj_at_k(answers, right, 5) == 1.0  # k = n: 3 votes for "7"
    assert maj_at_k(["1", "1", "2"], [False, False, False], 3) == 0.0  # c = 0
    assert maj_at_k([None, None], [False, False], 2) == 0.0


def test_avg_at_k_mean_and_std_by_hand():
    scores = [[1, 0, 1], [0, 0, 1]]  # two prompts, three samples each
    # per sample index: A = [0.5, 0.0, 1.0]; mean 0.5; std = sqrt((0 + .25 + .25) / 2) = 0.5
    mean, std = avg_at_k(scores, 3)
    assert mean == pytest.approx(0.5) and std == pytest.approx(0.5)
    mean, std = avg_at_k(scores, 2)  # A = [0.5, 0.0]: mean .25, std sqrt(2 * .0625 / 1)
    assert mean == pytest.approx(0.25) and std == pytest.approx(math.sqrt(0.125))
    assert avg_at_k(scores, 1) == (0.5, None)


def test_win_rate_counts_ties_half_and_skips_failures():
    rate, judged = win_rate(["A", "B", "tie", None, "A"])
    assert judged == 4 and rate == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    assert win_rate([None]) == (None, 0)


def test_lc_win_rate_without_length_differences_is_the_win_rate():
    verdicts = ["A", "B", "A", "tie"]
    assert lc_win_rate(verdicts, [10] * 4, [10] * 4) == pytest.approx(0.625, abs=1e-4)


def test_lc_win_rate_two_length_groups_by_hand():
    # half the pairs: the model's answer is 40 chars longer, it wins 3 of 4; other half 40 shorter, it wins 1 of 4.
    # With x = ±tanh(1) (|Δ| = sd(Δ)), the 2-parameter fit reproduces both groups: a + b·t = logit(.75),
    # a − b·t = logit(.25), so a = 0 and the length-controlled rate is σ(0) = 0.5 (raw: also .5, balanced)
    verdicts = ["A", "A", "A", "B", "A", "B", "B", "B"]
    model = [50] * 4 + [10] * 4
    base = [10] * 4 + [50] * 4
    assert lc_win_rate(verdicts, model, base) == pytest.approx(0.5, abs=1e-3)
    # unbalanced: long answers win 3/4 (4 pairs), short ones win 1/2 (2 pairs): the raw rate (4/6) rewards length;
    # a = (logit .75 + logit .5)/2 = ln(3)/2 -> σ = sqrt(3)/(1+sqrt(3)) ≈ 0.634
    verdicts = ["A", "A", "A", "B", "A", "B"]
    model, base = [50] * 4 + [10] * 2, [10] * 4 + [50] * 2
    # Δ = [40]*4 + [-40]*2: mean 13.33, sd = 37.71; x = tanh(±40/37.71) is ± the same t, so the fit is exact
    expected = 1 / (1 + math.exp(-math.log(3) / 2))
    assert win_rate(verdicts)[0] == pytest.approx(4 / 6)
    assert lc_win_rate(verdicts, model, base) == pytest.approx(expected, abs=1e-3)


def test_choose_summed_and_normalised():
    # choice 0: 2 tokens, sum -2 (mean -1); choice 1: 5 tokens, sum -3 (mean -0.6)
    assert choose([-2.0, -3.0], [2, 5], normalise=False) == 0
    assert choose([-2.0, -3.0], [2, 5], normalise=True) == 1
    assert choose([-1.0, -1.0], [1, 1], normalise=False) == 0  # tie: first


def test_parse_metrics_names_and_errors():
    spec = parse_metrics(["accuracy", "pass@8", "maj@4", "avg@8", "pass^2", "pass@1"])
    assert spec.greedy and spec.sampled == {"pass": [8, 1], "maj": [4], "avg": [8], "pass^": [2]} and spec.max_k == 8
    with pytest.raises(ValueError, match=r"unknown metric 'pas@4'.*Did you mean"):
        parse_metrics(["pas@4"])
    with pytest.raises(ValueError, match="k >= 1"):
        parse_metrics(["pass@0"])
