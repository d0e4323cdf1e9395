"""pass@k and τ-bench pass^k estimators."""

from itertools import combinations

import pytest

from lmrl.eval.tools import pass_at_k, pass_hat_k


@pytest.mark.parametrize("n, c, k", [(4, 0, 1), (4, 2, 2), (5, 3, 2), (8, 8, 4), (6, 1, 3), (3, 2, 3)])
def test_estimators_match_counting_every_k_subset(n, c, k):
    trials = [1] * c + [0] * (n - c)
    subsets = list(combinations(trials, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_pass_hat_k_is_at_most_pass_at_k_and_equal_at_k1():
    assert pass_hat_k(10, 4, 1) == pass_at_k(10, 4, 1) == 0.4
    assert pass_hat_k(10, 4, 3) < 0.4 < pass_at_k(10, 4, 3)


def test_bad_counts_fail():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_hat_k(3, 1, 4)
