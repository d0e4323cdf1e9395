"""Train-inference mismatch correction (`lmrl.algorithms.mismatch`): token, sequence and geometric importance
weights, truncated or masked, and the off-policy sequence mask, against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from lmrl.algorithms import importance_weights, offpolicy_mask, policy_loss

D = torch.float64
LOG = math.log

# Two rows (T = 3): row 0 has 3 completion tokens with ratios pi_old/pi_sampler [2, 0.5, 3]; row 1 has 2 tokens,
# [4, 0.25], and a padding position whose log-ratio (99) must be ignored everywhere.
LOG_RATIO = torch.tensor([[LOG(2), LOG(0.5), LOG(3)], [LOG(4), LOG(0.25), 99.0]], dtype=D)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
GEO0 = 3 ** (1 / 3)  # row 0's geometric mean: (2 * 0.5 * 3)^(1/3); row 1's is (4 * 0.25)^(1/2) = 1


def weights(**kw):
    return importance_weights(LOG_RATIO, MASK, **kw)


def test_token_truncate_caps_each_token():
    # [2, 0.5, 3 -> 2], [4 -> 2, 0.25]; clipped: 3 and 4 (2 is not above the cap) = 2 of 5 tokens
    w, stats = weights(level="token", mode="truncate", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[2, 0.5, 2], [2, 0.25, 0]], dtype=D), atol=1e-12, rtol=0)
    assert stats == pytest.approx({"weight_mean": 6.75 / 5, "weight_max": 2.0, "clip_frac": 0.4, "masked_frac": 0.0})


def test_token_mask_zeroes_tokens_outside_the_band():
    # band [1/2, 2]: keep 2 and 0.5 (the ends are inside), drop 3, 4 and 0.25; kept tokens keep their weight
    w, stats = weights(level="token", mode="mask", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[2, 0.5, 0], [0, 0, 0]], dtype=D), atol=1e-12, rtol=0)
    assert stats == pytest.approx({"weight_mean": 2.5 / 5, "weight_max": 2.0, "clip_frac": 0.0, "masked_frac": 0.6})
    # an explicit lower end: [0.2, 2] keeps 0.25 too
    w, stats = weights(level="token", mode="mask", high=2.0, low=0.2)
    assert w[1, 1].item() == pytest.approx(0.25) and stats["masked_frac"] == pytest.approx(0.4)


def test_sequence_weight_is_the_product_of_the_rows_ratios():
    # row 0: 2 * 0.5 * 3 = 3; row 1: 4 * 0.25 = 1 (the padding's 99 is not in the product)
    w, stats = weights(level="sequence", mode="truncate", high=10.0)
    torch.testing.assert_close(w, torch.tensor([[3, 3, 3], [1, 1, 0]], dtype=D), atol=1e-12, rtol=0)
    assert stats["weight_mean"] == pytest.approx((3 * 3 + 1 * 2) / 5)
    # cap 2: row 0 -> 2 on its 3 tokens (3 of 5 tokens clipped)
    w, stats = weights(level="sequence", mode="truncate", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[2, 2, 2], [1, 1, 0]], dtype=D), atol=1e-12, rtol=0)
    assert stats == pytest.approx({"weight_mean": 8 / 5, "weight_max": 2.0, "clip_frac": 0.6, "masked_frac": 0.0})
    # mask [1/2, 2]: row 0 (3) dropped whole, row 1 (1) kept
    w, stats = weights(level="sequence", mode="mask", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[0, 0, 0], [1, 1, 0]], dtype=D), atol=1e-12, rtol=0)
    assert stats["masked_frac"] == pytest.approx(0.6) and stats["weight_mean"] == pytest.approx(2 / 5)


def test_geometric_weight_is_the_mean_log_ratio_per_row():
    w, stats = weights(level="geometric", mode="truncate", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[GEO0] * 3, [1, 1, 0]], dtype=D), atol=1e-12, rtol=0)
    assert stats["clip_frac"] == 0.0 and stats["weight_max"] == pytest.approx(GEO0)
    assert stats["weight_mean"] == pytest.approx((3 * GEO0 + 2) / 5)
    # a tight band [1/1.2, 1.2] (SkyRL's advice is [0.99, 1.01]): row 0 (1.442) masked, row 1 (1.0) kept
    w, stats = weights(level="geometric", mode="mask", high=1.2)
    torch.testing.assert_close(w, torch.tensor([[0, 0, 0], [1, 1, 0]], dtype=D), atol=1e-12, rtol=0)
    assert stats["masked_frac"] == pytest.approx(0.6)


def test_off_applies_nothing_and_logs_the_raw_weights():
    w, stats = weights(level="token", mode="off", high=2.0)
    torch.testing.assert_close(w, MASK.to(D))
    assert stats == pytest.approx({"weight_mean": 9.75 / 5, "weight_max": 4.0, "clip_frac": 0.0, "masked_frac": 0.0})


def test_log_weights_are_clamped_before_exp():
    big = torch.tensor([[30.0, 30.0]], dtype=D)
    mask = torch.ones(1, 2, dtype=torch.bool)
    w, _ = importance_weights(big, mask, level="token", mode="off")
    assert w.eq(1).all()
    _, stats = importance_weights(big, mask, level="token", mode="off")
    assert stats["weight_max"] == pytest.approx(math.exp(10))  # token and geometric: |log w| <= 10
    _, stats = importance_weights(big, mask, level="sequence", mode="off")
    assert stats["weight_max"] == pytest.approx(math.exp(20))  # the sequence sum: |log w| <= 20


def test_offpolicy_mask_drops_rows_by_their_mean_log_ratio():
    # mean log-ratio: row 0 log(3)/3 = 0.366, row 1 (log 4 + log 0.25)/2 = 0
    keep = offpolicy_mask(LOG_RATIO, MASK, 0.3)
    assert keep.tolist() == [[False] * 3, [True, True, False]]
    assert offpolicy_mask(LOG_RATIO, MASK, 0.4).tolist() == MASK.tolist()
    assert offpolicy_mask(-LOG_RATIO, MASK, 0.3).tolist() == keep.tolist()  # |mean|: both directions


def test_offpolicy_mask_negative_rows_is_deepseeks_rule():
    # rows="negative": only tokens with A < 0 in rows the sampler found more likely (mean log-ratio < -threshold)
    sampler_likes_row0 = -LOG_RATIO  # row 0 mean -0.366
    both_negative = torch.tensor([-1.0, -1.0], dtype=D)
    keep = offpolicy_mask(sampler_likes_row0, MASK, 0.3, both_negative, rows="negative")
    assert keep.tolist() == [[False] * 3, [True, True, False]]
    keep = offpolicy_mask(LOG_RATIO, MASK, 0.3, both_negative, rows="negative")  # row 0 mean +0.366: kept
    assert keep.tolist() == MASK.tolist()
    per_token = torch.tensor([[1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]], dtype=D)  # (N, T) advantages
    keep = offpolicy_mask(sampler_likes_row0, MASK, 0.3, per_token, rows="negative")
    assert keep.tolist() == [[True, False, False], [True, True, False]]
    with pytest.raises(ValueError, match="pass `advantages`"):
        offpolicy_mask(LOG_RATIO, MASK, 0.3, rows="negative")


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"level": "seq"}, "level must be one of"),
        ({"mode": "clip"}, "mode must be one of"),
        ({"high": 0.0}, "must be > 0"),
        ({"mode": "truncate", "low": 0.5}, "needs mode 'mask'"),
        ({"mode": "mask", "high": 2.0, "low": 3.0}, "0 <= low <= high"),
    ],
)
def test_bad_options_raise_with_the_option_named(kw, match):
    with pytest.raises(ValueError, match=match):
        weights(**kw)


def test_policy_loss_multiplies_the_surrogate_and_keeps_the_normaliser():
    # pg with A = 1: per-token value -w, token_mean over all 5 completion tokens; d/dlogp = -w/5
    logp = torch.full((2, 3), -1.0, dtype=D, requires_grad=True)
    sampler = logp.detach() - LOG_RATIO.masked_fill(~MASK, 0.0)  # old_logp = logp: old - sampler = LOG_RATIO
    adv = torch.ones(2, dtype=D)
    loss, stats = policy_loss(
        "pg", logp, logp.detach(), adv, MASK, tis_cap=2.0, is_level="sequence", sampler_logp=sampler
    )
    loss.backward()
    assert loss.item() == pytest.approx(-8 / 5, abs=1e-12)
    torch.testing.assert_close(logp.grad, -torch.tensor([[2, 2, 2], [1, 1, 0]], dtype=D) / 5, atol=1e-12, rtol=0)
    assert stats["policy/tis_clip_frac"] == pytest.approx(0.6) and stats["policy/tis_weight_max"] == pytest.approx(2.0)
    # the off-policy mask alone (no IS weight): row 0 dropped, the normaliser stays 5 tokens
    loss, stats = policy_loss("pg", logp, logp.detach(), adv, MASK, offpolicy_mask_threshold=0.3, sampler_logp=sampler)
    assert loss.item() == pytest.approx(-2 / 5, abs=1e-12)
    assert stats["policy/offpolicy_masked_frac"] == pytest.approx(0.6) and "policy/tis_weight_mean" not in stats
    # mode off: the loss of no correction, the weights logged
    base, _ = policy_loss("pg", logp, logp.detach(), adv, MASK)
    loss, stats = policy_loss("pg", logp, logp.detach(), adv, MASK, tis_cap=2.0, is_mode="off", sampler_logp=sampler)
    assert loss.item() == base.item() and stats["policy/tis_weight_max"] == pytest.approx(4.0)


def test_policy_loss_default_is_the_token_truncated_weight():
    logp = torch.full((2, 3), -1.0, dtype=D)
    sampler = logp - LOG_RATIO.masked_fill(~MASK, 0.0)
    loss, stats = policy_loss("pg", logp, logp, torch.ones(2, dtype=D), MASK, tis_cap=2.0, sampler_logp=sampler)
    assert loss.item() == pytest.approx(-6.75 / 5, abs=1e-12)
    assert stats["policy/tis_weight_mean"] == pytest.approx(6.75 / 5) and stats[
        "policy/tis_clip_frac"
    ] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="pass `sampler_logp`"):
        policy_loss("pg", logp, logp, torch.ones(2, dtype=D), MASK, offpolicy_mask_threshold=0.3)
