"""avatarl from hidden states through chunked LM heads (`avatarl_head_loss`) equals `avatarl_rewards` +
`avatarl_loss` on the full logits: loss, stats and the gradients of the hidden states and head weight."""

from __future__ import annotations

import pytest
import torch

from lmrl.algorithms.avatarl import AvatarlOptions
from lmrl.algorithms.avatarl_head import avatarl_head_loss
from lmrl.trainers.pretrain.trainer import avatarl_objective


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    batch, seq, hidden, critic_hidden, vocab = 2, 7, 6, 5, 40
    h = torch.randn(batch, seq, hidden, generator=g, dtype=dtype)
    w = torch.randn(vocab, hidden, generator=g, dtype=dtype)
    hc = torch.randn(batch, seq, critic_hidden, generator=g, dtype=dtype)
    wc = torch.randn(vocab, critic_hidden, generator=g, dtype=dtype)
    targets = torch.randint(0, vocab, (batch, seq), generator=g)
    targets[1, -2:] = -100  # ignored positions
    return h, w, hc, wc, targets


def _reference(h, w, hc, wc, targets, options):
    h, w = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss, stats = avatarl_objective(h @ w.T, targets, hc @ wc.T, options)
    loss.backward()
    return loss.detach(), stats, h.grad, w.grad


@pytest.mark.parametrize("entropy_mode", ["bonus", "temperature"])
@pytest.mark.parametrize("rows", [1, 3, 100])
def test_chunked_heads_equal_full_logits(entropy_mode, rows):
    options = AvatarlOptions(top_k=4, entropy_mode=entropy_mode, entropy_coef=0.05)
    h, w, hc, wc, targets = _inputs(torch.float64)
    ref_loss, ref_stats, ref_dh, ref_dw = _reference(h, w, hc, wc, targets, options)
    h, w = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss, stats = avatarl_head_loss(h, w, hc, wc, targets, options, rows=rows)
    (2.0 * loss).backward()  # an upstream gradient other than 1 scales both gradients
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(h.grad, 2.0 * ref_dh, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w.grad, 2.0 * ref_dw, rtol=1e-10, atol=1e-12)
    stats.pop("loss/ce")
    assert stats.keys() == ref_stats.keys()
    for key, value in ref_stats.items():
        assert stats[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key  # expected_reward: fp32 in the reference


def test_train_ce_is_the_cross_entropy_of_valid_positions():
    options = AvatarlOptions(top_k=4)
    h, w, hc, wc, targets = _inputs(torch.float64)
    _, stats = avatarl_head_loss(h, w, hc, wc, targets, options, rows=4)
    valid = targets != -100
    expected = torch.nn.functional.cross_entropy((h @ w.T)[valid], targets[valid])
    assert stats["loss/ce"] == pytest.approx(expected.item(), rel=1e-10)


def test_a_critic_with_another_vocabulary_is_refused():
    h, w, hc, wc, targets = _inputs(torch.float32)
    with pytest.raises(ValueError, match="critic's vocabulary"):
        avatarl_head_loss(h, w, hc, wc[:-1], targets, AvatarlOptions(top_k=4), rows=4)
