"""Best-of-N / rejection-sampling selection and the KL of best-of-N, against hand computations."""

from itertools import combinations

import pytest
import torch

from lmrl.algorithms.best_of_n import bon_expected, bon_kl_bound, bon_kl_empirical, select_best, select_top_k

# 3 prompts x 4 samples, prompt-major: flat index = 4*i + j
R = torch.tensor(
    [
        [0.1, 0.9, 0.5, 0.9],  # prompt 0: samples 1 and 3 tie at the top
        [2.0, -1.0, 0.0, 1.0],  # prompt 1
        [0.3, 0.3, 0.3, 0.3],  # prompt 2: all tied
    ]
)


def test_select_best_per_prompt_takes_the_argmax_and_the_earlier_of_ties():
    # prompt 0: max 0.9 at j=1 and j=3 -> j=1 (flat 1); prompt 1: 2.0 at j=0 (flat 4);
    # prompt 2: all tied -> j=0 (flat 8)
    assert select_best(R).tolist() == [1, 4, 8]


def test_select_best_k_per_prompt_best_first():
    # prompt 0 by reward: 0.9 (j1), 0.9 (j3), 0.5 (j2) -> flat 1, 3; prompt 1: 2.0 (j0), 1.0 (j3) -> 4, 7;
    # prompt 2: ties in index order -> 8, 9
    assert select_best(R, k=2).tolist() == [1, 3, 4, 7, 8, 9]


def test_select_best_skips_ineligible_samples_and_short_prompts():
    eligible = torch.ones_like(R, dtype=torch.bool)
    eligible[0, 1] = False  # the first 0.9 of prompt 0 is e.g. truncated -> the other 0.9 (j3, flat 3) wins
    eligible[1] = torch.tensor([False, False, False, True])  # prompt 1 has a single eligible sample: j3 (flat 7)
    eligible[2] = False  # prompt 2 contributes nothing
    assert select_best(R, k=2, eligible=eligible).tolist() == [3, 2, 7]


def test_select_top_k_global_with_ties_to_the_lower_flat_index():
    # flat rewards sorted: 2.0 (4), 1.0 (7), 0.9 (1), 0.9 (3), 0.5 (2), 0.3 (8, 9, 10, 11), 0.1 (0), 0.0 (6), -1 (5)
    assert select_top_k(R, 4).tolist() == [4, 7, 1, 3]
    assert select_top_k(R, 7).tolist() == [4, 7, 1, 3, 2, 8, 9]
    # i = k // N, j = k % N (book): flat 7 is prompt 1, sample 3
    assert divmod(7, 4) == (1, 3) and R[1, 3] == 1.0


def test_select_top_k_more_than_available_is_a_clear_error():
    with pytest.raises(ValueError, match="top_k=13 but only 12 of the 12 samples are eligible"):
        select_top_k(R, 13)
    eligible = R > 0.4  # 5 samples: 0.9, 0.5, 0.9, 2.0, 1.0
    assert select_top_k(R, 5, eligible).tolist() == [4, 7, 1, 3, 2]
    with pytest.raises(ValueError, match="only 5 of the 12"):
        select_top_k(R, 6, eligible)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_k_and_n_are_clear_errors(bad):
    with pytest.raises(ValueError, match="int >= 1"):
        select_best(R, k=bad)
    with pytest.raises(ValueError, match="int >= 1"):
        select_top_k(R, bad)
    with pytest.raises(ValueError, match="N \\(samples per prompt\\) must be an int >= 1"):
        bon_kl_bound(bad)


def test_bad_reward_shapes_are_clear_errors():
    with pytest.raises(ValueError, match=r"\(M prompts, N samples\).*view\(-1, N\)"):
        select_best(torch.zeros(6))
    with pytest.raises(ValueError, match="NaN or inf"):
        select_best(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="k=5 samples per prompt but only N=4"):
        select_best(R, k=5)


def test_analytic_kl_bound_by_hand():
    # log N - (N-1)/N:  N=1 -> 0;  N=2 -> log 2 - 1/2 = 0.693147 - 0.5 = 0.193147;
    # N=4 -> log 4 - 3/4 = 1.386294 - 0.75 = 0.636294;  N=64 -> 4.158883 - 0.984375 = 3.174508
    assert bon_kl_bound(1) == 0.0
    assert bon_kl_bound(2) == pytest.approx(0.1931472, abs=1e-7)
    assert bon_kl_bound(4) == pytest.approx(0.6362944, abs=1e-7)
    assert bon_kl_bound(64) == pytest.approx(3.1745081, abs=1e-7)


def test_empirical_kl_on_hand_made_pools():
    # pool [1, 2, 2, 3], N=3. Levels: r=1 mass 1/4 (F=1/4, F-=0); r=2 mass 1/2 (F=3/4, F-=1/4);
    # r=3 mass 1/4 (F=1, F-=3/4).
    # P_BoN: (1/4)^3 = 0.015625; (3/4)^3 - (1/4)^3 = 0.40625; 1 - (3/4)^3 = 0.578125.
    # KL = 0.015625 log(0.0625) + 0.40625 log(0.8125) + 0.578125 log(2.3125)
    #    = -0.0433217 - 0.0843535 + 0.4846591 = 0.3569839   (< bound log 3 - 2/3 = 0.4319)
    # pool [0, 0, 1, 1], N=2: P_BoN(0) = 1/4, P_BoN(1) = 3/4: KL = 1/4 log(1/2) + 3/4 log(3/2) = 0.1308120
    # pool [5, 5, 5], any N: a single level, KL = 0.  N=1: best-of-1 is pi itself, KL = 0.
    pools = torch.tensor([[1.0, 2.0, 2.0, 3.0], [0.0, 0.0, 1.0, 1.0]])
    kl3 = bon_kl_empirical(pools, 3)
    assert kl3[0].item() == pytest.approx(0.3569839, abs=1e-6)
    assert bon_kl_empirical(pools, 2)[1].item() == pytest.approx(0.1308120, abs=1e-6)
    assert bon_kl_empirical(torch.full((1, 3), 5.0), 8).item() == pytest.approx(0.0, abs=1e-12)
    assert bon_kl_empirical(pools, 1).abs().max().item() < 1e-12
    # the order of the pool does not matter
    assert bon_kl_empirical(pools[:, [3, 1, 0, 2]], 3)[0].item() == pytest.approx(0.3569839, abs=1e-6)


def test_empirical_kl_approaches_the_bound_without_ties_and_never_exceeds_it():
    torch.manual_seed(0)
    for n in (2, 4, 16):
        small = bon_kl_empirical(torch.randn(3, 8), n)
        assert (small <= bon_kl_bound(n) + 1e-9).all()
    # distinct rewards in a pool of P: KL-hat = sum_k ((k/P)^n - ((k-1)/P)^n) log(P((k/P)^n - ((k-1)/P)^n)),
    # which tends to log n - (n-1)/n as P grows; at P = 2000, n = 4 it is within 3e-3 of 0.636294
    big = bon_kl_empirical(torch.randn(1, 2000), 4).item()
    assert big == pytest.approx(bon_kl_bound(4), abs=3e-3)
    assert big < bon_kl_bound(4)


def test_bon_expected_matches_hand_enumeration():
    # pool rewards [1, 3, 2] with values [10, 30, 20], n=2: the 3 pairs' best are {1,3}->30, {1,2}->20, {3,2}->30
    # mean = 80/3 = 26.6667. Weights by rank C(k-1, 1)/C(3, 2) = 0, 1/3, 2/3 over values sorted 10, 20, 30.
    pool, values = torch.tensor([[1.0, 3.0, 2.0]]), torch.tensor([[10.0, 30.0, 20.0]])
    assert bon_expected(pool, values, 2).item() == pytest.approx(80 / 3, abs=1e-5)
    assert bon_expected(pool, values, 1).item() == pytest.approx(20.0, abs=1e-5)  # the mean
    assert bon_expected(pool, values, 3).item() == pytest.approx(30.0, abs=1e-5)  # the value at the max


def test_bon_expected_splits_ties_equally_and_equals_brute_force():
    # pool [1, 2, 2, 0] values [a, b, c, d] = [1, 10, 100, 1000], n=2: 6 pairs, the best reward per pair and
    # (ties between samples 1 and 2 broken uniformly) its value:
    # {0,1}->10, {0,2}->100, {0,3}->1, {1,2}->(10+100)/2=55, {1,3}->10, {2,3}->100 -> mean 276/6 = 46.0
    pool, values = torch.tensor([[1.0, 2.0, 2.0, 0.0]]), torch.tensor([[1.0, 10.0, 100.0, 1000.0]])
    assert bon_expected(pool, values, 2).item() == pytest.approx(46.0, abs=1e-4)
    torch.manual_seed(1)
    pool = torch.randint(0, 4, (2, 7)).float()  # many ties
    values = torch.randn(2, 7)
    for n in (1, 3, 5):
        for i in range(2):
            total = []
            for subset in combinations(range(7), n):
                best = max(pool[i, j].item() for j in subset)
                tied = [values[i, j].item() for j in subset if pool[i, j].item() == best]
                total.append(sum(tied) / len(tied))
            assert bon_expected(pool, values, n)[i].item() == pytest.approx(sum(total) / len(total), abs=1e-5)


def test_bon_expected_bad_n():
    with pytest.raises(ValueError, match=r"in \[1, P=3\]"):
        bon_expected(torch.zeros(1, 3), torch.zeros(1, 3), 4)
