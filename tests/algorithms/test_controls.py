"""Tests for lmrl.algorithms.controls: which tokens are trained and the adaptive coefficients (hand values)."""

import pytest
import torch

from lmrl.algorithms import adaptive_entropy_coef, adaptive_kl_coef, high_entropy_tokens, overlong_filter


def test_overlong_filter_zeroes_the_truncated_rows_only():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])  # row 2: a multi-turn loss mask
    out = overlong_filter(mask, torch.tensor([False, True, False]))
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]))
    assert out.dtype == mask.dtype
    with pytest.raises(ValueError, match="one flag per completion"):
        overlong_filter(mask, torch.tensor([True, False]))


def test_high_entropy_tokens_keeps_the_top_quantile_of_the_masked_tokens():
    # masked entropies 0.1 0.9 0.5 | 0.3 0.7 (99 is padding and must not count); q = 0.4:
    # tau = 0.6-quantile of [0.1, 0.3, 0.5, 0.7, 0.9] = 0.5 + 0.4 * (0.7 - 0.5) = 0.58 -> keep 0.9 and 0.7
    entropy = torch.tensor([[0.1, 0.9, 0.5], [0.3, 0.7, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    keep = high_entropy_tokens(entropy, mask, 0.4)
    assert keep.tolist() == [[False, True, False], [False, True, False]]
    assert high_entropy_tokens(entropy, mask, 1.0).tolist() == mask.bool().tolist()  # q = 1: every masked token
    # q = 0.6: tau = 0.4-quantile = 0.3 + 0.6 * 0.2 = 0.42 -> 0.9, 0.5, 0.7
    assert high_entropy_tokens(entropy, mask, 0.6).tolist() == [[False, True, True], [False, True, False]]
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        high_entropy_tokens(entropy, mask, 0.0)


def test_adaptive_entropy_coef_steps_towards_the_target_and_stays_non_negative():
    assert adaptive_entropy_coef(0.01, entropy=0.5, target=1.0, step=0.005) == pytest.approx(0.015)  # below: up
    assert adaptive_entropy_coef(0.01, entropy=2.0, target=1.0, step=0.005) == pytest.approx(0.005)  # above: down
    assert adaptive_entropy_coef(0.003, entropy=2.0, target=1.0, step=0.005) == 0.0  # max(0, -0.002)
    assert adaptive_entropy_coef(0.01, entropy=1.0, target=1.0, step=0.005) == 0.01
    with pytest.raises(ValueError, match="target > 0"):
        adaptive_entropy_coef(0.01, entropy=1.0, target=0.0, step=0.005)


def test_adaptive_kl_coef_is_zieglers_proportional_controller():
    # KL 3x the target: error clip(3 - 1, -0.2, 0.2) = 0.2; 64 samples of a 128 horizon: 0.1 * (1 + 0.2 * 0.5) = 0.11
    assert adaptive_kl_coef(0.1, kl=0.3, target=0.1, horizon=128, n_steps=64) == pytest.approx(0.11)
    # KL 0.095 of 0.1: error -0.05 -> 0.1 * (1 - 0.05 * 0.5) = 0.0975
    assert adaptive_kl_coef(0.1, kl=0.095, target=0.1, horizon=128, n_steps=64) == pytest.approx(0.0975)
    # KL 0: error clipped to -0.2; a whole horizon of samples: 0.1 * 0.8
    assert adaptive_kl_coef(0.1, kl=0.0, target=0.1, horizon=64, n_steps=64) == pytest.approx(0.08)
    assert adaptive_kl_coef(0.1, kl=0.1, target=0.1, horizon=64, n_steps=64) == pytest.approx(0.1)  # on target
    with pytest.raises(ValueError, match="coef > 0"):
        adaptive_kl_coef(0.0, kl=0.1, target=0.1, horizon=64, n_steps=64)
