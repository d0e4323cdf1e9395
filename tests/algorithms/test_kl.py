"""Tests for lmrl.algorithms.kl (hand values in comments)."""

import math

import pytest
import torch

from lmrl.algorithms import kl, kl_penalized_rewards

D = torch.float64
LOGP = torch.tensor([[-1.0, -2.0, -0.5]], dtype=D)
REF = torch.tensor([[-1.5, -1.0, -0.5]], dtype=D)


def test_k1_k2_k3_on_numbers():
    # logp - ref = [0.5, -1.0, 0]
    # k1 = [0.5, -1, 0]; k2 = 0.5 * [0.25, 1, 0] = [0.125, 0.5, 0]
    # k3: log r = ref - logp = [-0.5, 1, 0], r = [e^-0.5, e, 1]
    #     r - 1 - log r = [0.6065307 - 1 + 0.5, 2.7182818 - 1 - 1, 0] = [0.1065307, 0.7182818, 0]
    torch.testing.assert_close(kl(LOGP, REF, "k1"), torch.tensor([[0.5, -1.0, 0.0]], dtype=D), atol=1e-12, rtol=0)
    torch.testing.assert_close(kl(LOGP, REF, "k2"), torch.tensor([[0.125, 0.5, 0.0]], dtype=D), atol=1e-12, rtol=0)
    want_k3 = torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]], dtype=D)
    torch.testing.assert_close(kl(LOGP, REF, "k3"), want_k3, atol=1e-12, rtol=0)
    assert kl(LOGP, REF, "k3")[0, 0].item() == pytest.approx(0.1065307, abs=1e-7)
    torch.testing.assert_close(kl(LOGP, REF), kl(LOGP, REF, "k1"))  # default is k1


def test_k3_is_nonnegative_and_finite_at_extremes():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(64, 32, generator=g) * 10
    ref = torch.randn(64, 32, generator=g) * 10
    k3 = kl(logp, ref, "k3")
    assert (k3 >= 0).all() and torch.isfinite(k3).all()
    # log r = -100 clamps to -20: k3 = e^-20 - 1 + 20 = 19.000000002
    extreme = kl(torch.tensor([[0.0]], dtype=D), torch.tensor([[-100.0]], dtype=D), "k3")
    assert extreme.item() == pytest.approx(19.0 + math.exp(-20), abs=1e-12)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_k1_and_k3_are_unbiased_exactly(estimator):
    # E_{y~p}[k(y)] summed exactly over a 5-token vocabulary equals KL(p||q) = sum p log(p/q):
    # k3: sum p (q/p - 1 - log(q/p)) = 1 - 1 + KL.
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=D)
    q = torch.tensor([0.1, 0.3, 0.2, 0.2, 0.2], dtype=D)
    exact = (p * (p / q).log()).sum()
    est = (p * kl(p.log()[None], q.log()[None], estimator)[0]).sum()
    torch.testing.assert_close(est, exact, atol=1e-12, rtol=0)


def test_kl_bad_input():
    with pytest.raises(ValueError, match="Did you mean 'k3'"):
        kl(LOGP, REF, "k_3")
    with pytest.raises(ValueError, match="Supported names: 'k1', 'k2', 'k3'"):
        kl(LOGP, REF, "k4")
    with pytest.raises(ValueError, match="same shape"):
        kl(LOGP, REF[:, :2])


def test_kl_penalized_rewards_hand_values():
    # beta = 0.5: every token gets -0.5*kl; the scalar reward lands on the last real token.
    # row 0 (3 tokens): [-0.05, -0.10, -0.15 + 1] = [-0.05, -0.1, 0.85, 0]
    # row 1 (2 tokens): [-0.25, -0.25 - 1] = [-0.25, -1.25, 0, 0]; padding kl=9 never leaks
    kl_tok = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, 0.5, 9.0, 9.0]], dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    out = kl_penalized_rewards(torch.tensor([1.0, -1.0]), kl_tok, mask, beta=0.5)
    want = torch.tensor([[-0.05, -0.1, 0.85, 0.0], [-0.25, -1.25, 0.0, 0.0]])
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)
    assert not out.requires_grad


def test_kl_penalized_rewards_left_padding_and_gaps():
    # last real token of [0, 1, 0, 1, 0] is index 3; beta = 0 leaves just the reward
    out = kl_penalized_rewards(torch.tensor([2.0]), torch.ones(1, 5), torch.tensor([[0, 1, 0, 1, 0]]), 0.0)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 0.0, 2.0, 0.0]]))


def test_kl_penalized_rewards_bad_input():
    with pytest.raises(ValueError, match=r"rows \[1\] have no completion token"):
        kl_penalized_rewards(torch.zeros(2), torch.zeros(2, 3), torch.tensor([[1, 0, 0], [0, 0, 0]]), 0.1)
    with pytest.raises(ValueError, match=r"\(N,\)"):
        kl_penalized_rewards(torch.zeros(3), torch.zeros(2, 3), torch.ones(2, 3), 0.1)
    with pytest.raises(ValueError, match="beta"):
        kl_penalized_rewards(torch.zeros(2), torch.zeros(2, 3), torch.ones(2, 3), -0.1)
