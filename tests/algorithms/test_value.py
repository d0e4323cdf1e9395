"""Tests for lmrl.algorithms.value (hand values in comments)."""

import pytest
import torch

from lmrl.algorithms import value_loss

D = torch.float64

# row 0 (3 tokens), row 1 (1 token + padding with garbage)
OLD = torch.tensor([[1.5, 2.0, 3.0], [0.0, 5.0, 5.0]], dtype=D)
RET = torch.tensor([[2.0, 1.0, 2.5], [1.0, 5.0, 5.0]], dtype=D)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def _values():
    return torch.tensor([[1.0, 1.2, 3.0], [0.5, 77.0, float("nan")]], dtype=D, requires_grad=True)


def test_clipped_value_loss_hand_values():
    # clip 0.2, v_clip = old + clamp(v - old, -0.2, 0.2), per token 0.5 max(err, err_clip):
    # (0,0) v=1,   old=1.5, G=2:   v_clip 1.3; err 1,    err_c 0.49 -> 0.5    (unclipped)
    # (0,1) v=1.2, old=2,   G=1:   v_clip 1.8; err 0.04, err_c 0.64 -> 0.32   (clipped)
    # (0,2) v=3,   old=3,   G=2.5: v_clip 3;   err 0.25 = err_c     -> 0.125  (tie, not clipped)
    # (1,0) v=0.5, old=0,   G=1:   v_clip 0.2; err 0.25, err_c 0.64 -> 0.32   (clipped)
    # seq_mean: row 0 (0.5+0.32+0.125)/3 = 0.315, row 1 0.32 -> (0.315+0.32)/2 = 0.3175
    v = _values()
    loss, stats = value_loss(v, OLD, RET, MASK)
    loss.backward()
    assert loss.item() == pytest.approx(0.3175, abs=1e-12)
    assert stats["value/clip_frac"] == pytest.approx(0.5)  # 2 of 4 tokens
    assert stats["value/mean"] == pytest.approx(5.7 / 4)  # (1 + 1.2 + 3 + 0.5)/4 = 1.425
    assert stats["value/returns_mean"] == pytest.approx(6.5 / 4)  # (2 + 1 + 2.5 + 1)/4 = 1.625
    # grad: (v - G) * 1/(N |a_i|) on unclipped tokens, 0 on clipped ones; at the tie the two
    # equal branches share the gradient, which still sums to (v - G):
    # (0,0) (1-2)/6 = -1/6; (0,1) 0; (0,2) (3-2.5)/6 = 1/12; (1,0) 0; padding 0
    want = torch.tensor([[-1 / 6, 0.0, 1 / 12], [0.0, 0.0, 0.0]], dtype=D)
    torch.testing.assert_close(v.grad, want, atol=1e-12, rtol=0)


def test_unclipped_value_loss():
    # 0.5 (v - G)^2: row 0 [0.5, 0.02, 0.125] mean 0.215; row 1 [0.125] -> (0.215 + 0.125)/2 = 0.17
    v = _values()
    loss, stats = value_loss(v, OLD, RET, MASK, clip=None)
    loss.backward()
    assert loss.item() == pytest.approx(0.17, abs=1e-12)
    assert stats["value/clip_frac"] == 0.0
    want = torch.tensor([[-1 / 6, 0.2 / 6, 0.5 / 6], [-0.25, 0.0, 0.0]], dtype=D)
    torch.testing.assert_close(v.grad, want, atol=1e-12, rtol=0)


def test_value_loss_token_mean_and_targets_are_detached():
    # token_mean of the clipped per-token terms: (0.5 + 0.32 + 0.125 + 0.32)/4 = 0.31625
    old = OLD.clone().requires_grad_()
    ret = RET.clone().requires_grad_()
    loss, _ = value_loss(_values(), old, ret, MASK, agg="token_mean")
    loss.backward()
    assert loss.item() == pytest.approx(0.31625, abs=1e-12)
    assert old.grad is None and ret.grad is None


def test_value_loss_bad_input():
    with pytest.raises(ValueError, match="clip"):
        value_loss(_values(), OLD, RET, MASK, clip=0.0)
    with pytest.raises(ValueError, match="returns"):
        value_loss(_values(), OLD, RET[:, :2], MASK)
    with pytest.raises(ValueError, match="aggregation mode"):
        value_loss(_values(), OLD, RET, MASK, agg="mean")


def test_value_loss_inside_band_is_exactly_unclipped():
    # float32 values near 0 with |v - old| < clip on every token: v - old is inexact when
    # v and old differ in sign or exponent, so old + (v - old) rounds off v on about a third
    # of the tokens and the old formula gave vf_clip_frac 0.108. Clamping v keeps v_clip == v.
    g = torch.Generator().manual_seed(0)
    old = torch.randn(64, 32, generator=g) * 0.03
    v = torch.randn(64, 32, generator=g) * 0.03
    ret = torch.randn(64, 32, generator=g) * 0.03
    mask = torch.ones(64, 32)
    assert float((v - old).abs().max()) < 0.2
    loss, stats = value_loss(v, old, ret, mask, clip=0.2)
    plain, _ = value_loss(v, old, ret, mask, clip=None)
    assert stats["value/clip_frac"] == 0.0
    assert loss.item() == plain.item()


def test_value_loss_clip_frac_hand_values():
    # clip 0.5, token_mean, v_clip = clamp(v, old - 0.5, old + 0.5), per token 0.5 max(err, err_c):
    # v=100.25, old=100, G=99:  inside the band, v_clip = v; err = err_c 1.5625 -> 0.78125 (not clipped)
    # v=101,    old=100, G=99:  v_clip 100.5; err 4, err_c 2.25 -> 2       (not clipped)
    # v=99,     old=100, G=98:  v_clip 99.5;  err 1, err_c 2.25 -> 1.125   (clipped)
    # v=101,    old=100, G=102: v_clip 100.5; err 1, err_c 2.25 -> 1.125   (clipped)
    # token_mean (0.78125 + 2 + 1.125 + 1.125)/4 = 1.2578125; clip frac 2/4
    v = torch.tensor([[100.25, 101.0, 99.0, 101.0]])
    old = torch.tensor([[100.0, 100.0, 100.0, 100.0]])
    ret = torch.tensor([[99.0, 99.0, 98.0, 102.0]])
    loss, stats = value_loss(v, old, ret, torch.ones(1, 4), clip=0.5, agg="token_mean")
    assert stats["value/clip_frac"] == 0.5
    assert loss.item() == 1.2578125
