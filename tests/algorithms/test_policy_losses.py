"""Tests for lmrl.algorithms.policy_losses (hand values in comments)."""

import inspect
import math

import pytest
import torch

from lmrl.algorithms import POLICY_LOSSES, kl, policy_loss

D = torch.float64
LOG = math.log


def _leaf(values):
    return torch.tensor(values, dtype=D, requires_grad=True)


def _ragged(seed=0, n=4, t_len=5):
    """Random logp leaf (N, T), advantages (N,) and a mask with lengths 5, 3, 1, 4."""
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(n, t_len, generator=g, dtype=D) * 3).requires_grad_()
    adv = torch.randn(n, generator=g, dtype=D)
    mask = torch.zeros(n, t_len)
    for i, length in enumerate([5, 3, 1, 4][:n]):
        mask[i, :length] = 1.0
    return logp, adv, mask


# ----------------------------------------------------------------------------- ppo


def test_ppo_clip_cases():
    # one token per row, token_mean over 5 tokens, eps = 0.2; l = max(-A rho, -A clip(rho))
    # a) A=+1, rho=1.5: max(-1.5, -1.2) = -1.2, clipped -> grad 0
    # b) A=-1, rho=0.5: max(0.5, 0.8) = 0.8, clipped -> grad 0
    # c) A=+2, rho=1.1: inside the band, -2.2, grad = -A rho = -2.2
    # d) A=-1, rho=1.5: max(1.5, 1.2) = 1.5 unclipped, grad = -A rho = 1.5
    # e) A=+1, rho=0.5: max(-0.5, -0.8) = -0.5 unclipped, grad = -0.5
    # loss = (-1.2 + 0.8 - 2.2 + 1.5 - 0.5)/5 = -0.32; grads /5; clip_frac = 2/5
    old = torch.zeros(5, 1, dtype=D)
    logp = _leaf([[LOG(1.5)], [LOG(0.5)], [LOG(1.1)], [LOG(1.5)], [LOG(0.5)]])
    adv = torch.tensor([1.0, -1.0, 2.0, -1.0, 1.0], dtype=D)
    loss, stats = policy_loss("ppo", logp, old, adv, torch.ones(5, 1))
    loss.backward()
    assert loss.item() == pytest.approx(-0.32, abs=1e-12)
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0.0], [0.0], [-2.2], [1.5], [-0.5]], dtype=D) / 5, atol=1e-12, rtol=0
    )
    assert stats["policy/clip_frac"] == pytest.approx(0.4)
    # ratio/mean = (1.5 + 0.5 + 1.1 + 1.5 + 0.5)/5 = 1.02, ratio/max = 1.5
    assert stats["policy/ratio_mean"] == pytest.approx(1.02) and stats["policy/ratio_max"] == pytest.approx(1.5)


def test_ppo_asymmetric_clip():
    # clip_low = 0.2, clip_high = 0.28 (DAPO): band [0.8, 1.28]
    # A=+1, rho=1.25: inside -> grad -1.25 (symmetric 0.2 would clip it: grad 0)
    # A=-1, rho=0.75: below 0.8 -> clipped, value 0.8, grad 0
    old = torch.zeros(2, 1, dtype=D)
    adv = torch.tensor([1.0, -1.0], dtype=D)
    logp = _leaf([[LOG(1.25)], [LOG(0.75)]])
    loss, stats = policy_loss("ppo", logp, old, adv, torch.ones(2, 1), clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert loss.item() == pytest.approx((-1.25 + 0.8) / 2, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.25 / 2], [0.0]], dtype=D), atol=1e-12, rtol=0)
    assert stats["policy/clip_frac"] == pytest.approx(0.5)
    logp = _leaf([[LOG(1.25)], [LOG(0.75)]])
    policy_loss("ppo", logp, old, adv, torch.ones(2, 1)).__getitem__(0).backward()
    torch.testing.assert_close(logp.grad, torch.zeros(2, 1, dtype=D), atol=1e-12, rtol=0)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "seq_sum_norm"])
def test_on_policy_first_step_all_losses_give_the_vanilla_pg_gradient(agg):
    # old_logp == logp.detach(): rho = 1 inside every band, so each surrogate's gradient is
    # -A * grad logp aggregated; for token_mean that is -A_i / (5+3+1+4) on each real token.
    logp, adv, mask = _ragged()
    grads = {}
    for name in POLICY_LOSSES:
        logp.grad = None
        loss, _ = policy_loss(name, logp, logp.detach(), adv, mask, agg=agg)
        loss.backward()
        grads[name] = logp.grad.clone()
    for name in ("ppo", "gspo", "cispo"):
        torch.testing.assert_close(grads[name], grads["pg"], atol=1e-12, rtol=0)
    if agg == "token_mean":
        torch.testing.assert_close(grads["pg"], -adv[:, None] * mask / 13, atol=1e-12, rtol=0)


def test_pg_value_and_gradient():
    # l = -A exp(logp - sg(logp)) = -A: loss = -(1*2 + (-3)*1)/3 tokens = 1/3; grad = -A/3
    logp = _leaf([[-1.0, -2.0], [-0.5, -9.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, stats = policy_loss("pg", logp, logp.detach() + 0.3, torch.tensor([1.0, -3.0], dtype=D), mask)
    loss.backward()
    assert loss.item() == pytest.approx(1 / 3, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 3, -1 / 3], [1.0, 0.0]], dtype=D), atol=1e-12, rtol=0)
    # stats still see old_logp: log ratio -0.3 -> approx_kl = 0.5 * 0.09 = 0.045
    assert stats["policy/clip_frac"] == 0.0 and stats["policy/approx_kl"] == pytest.approx(0.045)
    assert stats["policy/ratio_mean"] == pytest.approx(math.exp(-0.3))


def test_per_token_advantages_are_used_per_token():
    # pg with A (N, T) = [[1, 2]]: loss = -(1 + 2)/2 = -1.5, grad = [-0.5, -1]
    logp = _leaf([[-1.0, -1.0]])
    loss, _ = policy_loss("pg", logp, logp.detach(), torch.tensor([[1.0, 2.0]], dtype=D), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(-1.5)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -1.0]], dtype=D), atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------- gspo


def test_gspo_sequence_ratio_value_and_gradient():
    # row 0: logp - old = [0.3, -0.1, 0.1], mean 0.1 -> s0 = e^0.1 = 1.1051709; A0 = 1
    # row 1: logp - old = [0.2, -0.1] (+ padding), mean 0.05 -> s1 = e^0.05 = 1.0512711; A1 = 2
    # band 0.2 both sides: both inside. seq_mean loss = mean(-1*s0, -2*s1) = -1.6038566
    # sequence objective gradient: d(-A_i s_i)/dlogp_{i,t} = -A_i s_i / |a_i|, times 1/N = 1/2:
    #   row 0: -1.1051709/6 = -0.1841952 per token; row 1: -2*1.0512711/4 = -0.5256355 per token
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]], dtype=D)
    logp = (old + torch.tensor([[0.3, -0.1, 0.1], [0.2, -0.1, 0.0]], dtype=D)).requires_grad_()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, 2.0], dtype=D)
    loss, stats = policy_loss("gspo", logp, old, adv, mask, agg="seq_mean", clip_low=0.2, clip_high=0.2)
    loss.backward()
    s0, s1 = math.exp(0.1), math.exp(0.05)
    assert loss.item() == pytest.approx(-(s0 + 2 * s1) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(-1.6038566, abs=1e-7)
    want = torch.tensor([[-s0 / 6] * 3, [-s1 / 2, -s1 / 2, 0.0]], dtype=D)
    torch.testing.assert_close(logp.grad, want, atol=1e-12, rtol=0)
    assert stats["policy/seq_ratio_mean"] == pytest.approx((s0 + s1) / 2)
    assert stats["policy/seq_ratio_max"] == pytest.approx(s0)

    # the same gradient by autograd through the direct sequence-level objective
    ref = logp.detach().clone().requires_grad_()
    s = torch.exp(((ref - old) * mask).sum(1) / mask.sum(1))  # (N,)
    obj = -torch.minimum(s * adv, s.clamp(0.8, 1.2) * adv).mean()
    obj.backward()
    torch.testing.assert_close(logp.grad, ref.grad, atol=1e-12, rtol=0)


def test_gspo_default_clip_is_tight_and_zeroes_clipped_sequences():
    # defaults 3e-4 / 4e-4 (GSPO paper §5.1): band [0.9997, 1.0004]
    # row 0: A=+1, s = e^0.1 > 1.0004 -> clipped: value -1.0004, grad 0
    # row 1: A=-1, s = e^-0.05 < 0.9997 -> clipped: value -(-1)*0.9997 = 0.9997, grad 0
    old = torch.zeros(2, 2, dtype=D)
    logp = _leaf([[0.1, 0.1], [-0.05, -0.05]])
    loss, stats = policy_loss("gspo", logp, old, torch.tensor([1.0, -1.0], dtype=D), torch.ones(2, 2))
    loss.backward()
    assert loss.item() == pytest.approx((-1.0004 + 0.9997) / 2, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.zeros(2, 2, dtype=D), atol=0, rtol=0)
    assert stats["policy/clip_frac"] == 1.0


def test_gspo_requires_per_sequence_advantages():
    logp, adv, mask = _ragged()
    with pytest.raises(ValueError, match="one advantage per sequence"):
        policy_loss("gspo", logp, logp.detach(), torch.randn(4, 5, dtype=D), mask)
    # (N, T) constant per row (padding may differ) is accepted and equals the (N,) form
    per_token = adv[:, None].expand(4, 5).clone()
    per_token[1, 4] = 99.0  # padding
    a, _ = policy_loss("gspo", logp, logp.detach() - 0.01, per_token, mask)
    b, _ = policy_loss("gspo", logp, logp.detach() - 0.01, adv, mask)
    assert a.item() == b.item()


# ----------------------------------------------------------------------------- cispo


def test_cispo_gradient_is_clipped_weight_times_advantage():
    # rho = [1.5, 0.5, 1.0], A = 2, logp = [-1, -2, -0.5], token_mean over 3 tokens
    # defaults clip_low = 1.0 (lower bound 0), clip_high = 0.28: w = sg(clip(rho)) = [1.28, 0.5, 1]
    # loss = -(1/3) * 2 * (1.28*-1 + 0.5*-2 + 1*-0.5) = -(2/3) * (-2.78) = 1.8533333
    # grad = -w A / 3 = [-0.8533333, -0.3333333, -0.6666667]: clipped tokens keep a gradient
    logp = _leaf([[-1.0, -2.0, -0.5]])
    old = logp.detach() - torch.tensor([[LOG(1.5), LOG(0.5), 0.0]], dtype=D)
    adv = torch.tensor([2.0], dtype=D)
    loss, stats = policy_loss("cispo", logp, old, adv, torch.ones(1, 3))
    loss.backward()
    assert loss.item() == pytest.approx(2 * 2.78 / 3, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28, -0.5, -1.0]], dtype=D) * 2 / 3, atol=1e-12, rtol=0)
    assert stats["policy/clip_frac"] == pytest.approx(1 / 3)
    # clip_low = 0.2: w = [1.28, 0.8, 1] -> grad [-0.8533333, -0.5333333, -0.6666667]
    logp.grad = None
    loss, stats = policy_loss("cispo", logp, old, adv, torch.ones(1, 3), clip_low=0.2)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28, -0.8, -1.0]], dtype=D) * 2 / 3, atol=1e-12, rtol=0)
    assert stats["policy/clip_frac"] == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------- TIS and KL


def test_tis_caps_weights_and_multiplies_the_policy_loss():
    # old - sampler = [log 3, log 0.5, 0, 15 -> clamp 10]: raw w = [3, 0.5, 1, e^10]; cap 2 ->
    # w = [2, 0.5, 1, 2]. pg with A = 1: loss = -(2 + 0.5 + 1 + 2)/4 = -1.375, grad = -w/4
    logp = _leaf([[-1.0, -1.0, -1.0, -1.0]])
    old = logp.detach().clone().requires_grad_()
    sampler = old.detach() - torch.tensor([[LOG(3), LOG(0.5), 0.0, 15.0]], dtype=D)
    loss, stats = policy_loss(
        "pg", logp, old, torch.ones(1, dtype=D), torch.ones(1, 4), tis_cap=2.0, sampler_logp=sampler
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.375, abs=1e-12)
    torch.testing.assert_close(logp.grad, -torch.tensor([[2.0, 0.5, 1.0, 2.0]], dtype=D) / 4, atol=1e-12, rtol=0)
    assert old.grad is None  # weights are detached
    assert stats["policy/tis_weight_mean"] == pytest.approx(1.375)
    assert stats["policy/tis_clip_frac"] == pytest.approx(0.5)
    # |gap| mean = (1.0986123 + 0.6931472 + 0 + 15)/4 = 4.1979399
    assert stats["policy/sampler_logp_gap"] == pytest.approx((LOG(3) + LOG(2) + 15) / 4)


def test_sampler_logp_without_cap_only_logs_the_gap():
    logp, adv, mask = _ragged()
    base, _ = policy_loss("ppo", logp, logp.detach(), adv, mask)
    loss, stats = policy_loss("ppo", logp, logp.detach(), adv, mask, sampler_logp=logp.detach() - 0.1)
    assert loss.item() == base.item()
    assert stats["policy/sampler_logp_gap"] == pytest.approx(0.1) and "policy/tis_weight_mean" not in stats


def test_kl_in_loss_k1_and_k3_hand_values():
    # A = 0 so only kl_coef * mean kl remains; logp = [-1, -2], ref = [-1.5, -1]
    # k1 = [0.5, -1]: loss = 0.1 * (-0.25) = -0.025, grad = 0.1/2 = 0.05 per token
    # k3 = [e^-0.5 - 0.5, e - 2]: loss = 0.1 * mean; dk3/dlogp = 1 - r = [1 - e^-0.5, 1 - e]
    ref = torch.tensor([[-1.5, -1.0]], dtype=D)
    zero = torch.zeros(1, dtype=D)
    logp = _leaf([[-1.0, -2.0]])
    loss, stats = policy_loss(
        "pg", logp, logp.detach(), zero, torch.ones(1, 2), kl_coef=0.1, ref_logp=ref, kl_estimator="k1"
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.025, abs=1e-12) and stats["kl"] == pytest.approx(-0.25)
    torch.testing.assert_close(logp.grad, torch.tensor([[0.05, 0.05]], dtype=D), atol=1e-12, rtol=0)
    logp = _leaf([[-1.0, -2.0]])
    loss, stats = policy_loss("pg", logp, logp.detach(), zero, torch.ones(1, 2), kl_coef=0.1, ref_logp=ref)
    loss.backward()
    k3_mean = (math.exp(-0.5) - 0.5 + math.e - 2) / 2  # 0.4124062
    assert loss.item() == pytest.approx(0.1 * k3_mean, abs=1e-12) and stats["kl"] == pytest.approx(k3_mean)
    want = 0.1 / 2 * torch.tensor([[1 - math.exp(-0.5), 1 - math.e]], dtype=D)
    torch.testing.assert_close(logp.grad, want, atol=1e-12, rtol=0)


def test_kl_in_loss_adds_kl_coef_times_aggregated_kl():
    logp, adv, mask = _ragged()
    ref = logp.detach() + 0.2 * torch.randn(4, 5, generator=torch.Generator().manual_seed(3), dtype=D)
    old = logp.detach() - 0.05
    for agg in ("token_mean", "seq_mean"):
        base, stats0 = policy_loss("ppo", logp, old, adv, mask, agg=agg, ref_logp=ref)  # kl logged only
        with_kl, _ = policy_loss("ppo", logp, old, adv, mask, agg=agg, kl_coef=0.3, ref_logp=ref)
        kl_tok = kl(logp.detach(), ref, "k3") * mask
        kl_agg = kl_tok.sum() / mask.sum() if agg == "token_mean" else (kl_tok.sum(1) / mask.sum(1)).mean()
        assert with_kl.item() - base.item() == pytest.approx(0.3 * kl_agg.item(), abs=1e-12)
        assert stats0["kl"] == pytest.approx((kl_tok.sum() / mask.sum()).item())


# ----------------------------------------------------------------------------- contract and errors


def test_padding_with_inf_logp_gives_finite_loss_and_zero_padding_grad():
    logp, adv, mask = _ragged()
    for name in POLICY_LOSSES:
        logp.grad = None
        bad = torch.where(mask.bool(), logp, torch.tensor(float("-inf"), dtype=D))
        loss, _ = policy_loss(name, bad, logp.detach() - 0.1, adv, mask, ref_logp=logp.detach(), kl_coef=0.1)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
        assert (logp.grad[mask == 0] == 0).all()


def test_every_entry_shares_one_signature():
    for name in POLICY_LOSSES:
        params = list(inspect.signature(POLICY_LOSSES.get(name)).parameters.values())
        assert [p.name for p in params[:4]] == ["logp", "old_logp", "advantages", "mask"]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[4:])


def test_stats_are_python_floats():
    logp, adv, mask = _ragged()
    for name in POLICY_LOSSES:
        _, stats = policy_loss(
            name, logp, logp.detach(), adv, mask, ref_logp=logp.detach(), tis_cap=2.0, sampler_logp=logp.detach()
        )
        assert {
            "policy/clip_frac",
            "policy/approx_kl",
            "policy/ratio_mean",
            "policy/ratio_max",
            "kl",
            "policy/tis_weight_mean",
            "policy/tis_clip_frac",
            "policy/sampler_logp_gap",
        } <= set(stats)
        assert all(type(v) is float for v in stats.values())


@pytest.mark.parametrize(
    "name, opts, match",
    [
        ("ppoo", {}, "Did you mean 'ppo'"),
        ("ppo", {"clip_hihg": 0.3}, "Did you mean 'clip_high'"),
        ("pg", {"clip_low": 0.2}, "Unknown option 'clip_low'"),
        ("ppo", {"kl_coef": 0.1}, "ref_logp"),
        ("ppo", {"tis_cap": 2.0}, "sampler_logp"),
        ("ppo", {"kl_estimator": "k5"}, "KL estimator"),
        ("ppo", {"clip_low": -0.1}, ">= 0"),
        ("ppo", {"agg": "mean"}, "aggregation mode"),
        ("ppo", {"kl_coef": -1.0}, "kl_coef"),
    ],
)
def test_bad_names_and_options(name, opts, match):
    logp, adv, mask = _ragged()
    with pytest.raises(ValueError, match=match):
        policy_loss(name, logp, logp.detach(), adv, mask, **opts)


def test_bad_shapes_and_values():
    logp, adv, mask = _ragged()
    with pytest.raises(ValueError, match="advantages"):
        policy_loss("ppo", logp, logp.detach(), adv[:3], mask)
    with pytest.raises(ValueError, match="old_logp"):
        policy_loss("ppo", logp, logp.detach()[:, :4], adv, mask)
    nan_old = logp.detach().clone()
    nan_old[0, 0] = float("nan")
    with pytest.raises(ValueError, match="old_logp"):
        policy_loss("ppo", logp, nan_old, adv, mask)


# ----------------------------------------------------------------------------- dual clip, two-sided clip


def _dual_clip_batch():
    # one token per row, old_logp 0, eps 0.2: rho = 4, 2, 4, 0.5 with A = -1, -1, +1, -2
    old = torch.zeros(4, 1, dtype=D)
    logp = _leaf([[LOG(4.0)], [LOG(2.0)], [LOG(4.0)], [LOG(0.5)]])
    return logp, old, torch.tensor([-1.0, -1.0, 1.0, -2.0], dtype=D), torch.ones(4, 1)


@pytest.mark.parametrize("bound", [{"clip_ratio_c": 3.0}, {"clip_delta": 3.0}])
def test_dual_clip_and_two_sided_clip_bound_the_loss_of_negative_advantages(bound):
    # a) A=-1, rho=4: PPO max(4, 1.2) = 4; bound -A c = 3 -> 3, grad 0
    # b) A=-1, rho=2: max(2, 1.2) = 2 < 3 -> 2, grad -A rho = 2
    # c) A=+1, rho=4: max(-4, -1.2) = -1.2 (positive advantages are not dual-clipped), grad 0
    # d) A=-2, rho=0.5: max(1, 1.6) = 1.6 < 6 -> 1.6, grad 0
    # token_mean = (3 + 2 - 1.2 + 1.6) / 4 = 1.35 (plain PPO: (4 + 2 - 1.2 + 1.6) / 4 = 1.6)
    logp, old, adv, mask = _dual_clip_batch()
    loss, stats = policy_loss("ppo", logp, old, adv, mask, **bound)
    loss.backward()
    assert loss.item() == pytest.approx(1.35, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0], [2.0], [0.0], [0.0]], dtype=D) / 4, atol=1e-12, rtol=0)
    assert stats["policy/clip_frac"] == pytest.approx(0.5)  # c) and d): the clipped branch is larger
    if "clip_ratio_c" in bound:
        assert stats["policy/clip_frac_lower"] == pytest.approx(0.25)  # a)
    plain, _ = policy_loss("ppo", logp.detach(), old, adv, mask)
    assert plain.item() == pytest.approx(1.6, abs=1e-12)


def test_dual_clip_and_two_sided_clip_refuse_bounds_that_would_cut_the_band():
    logp, old, adv, mask = _dual_clip_batch()
    with pytest.raises(ValueError, match="must be > 1"):
        policy_loss("ppo", logp, old, adv, mask, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match=r"> 1 \+ clip_high"):
        policy_loss("ppo", logp, old, adv, mask, clip_delta=1.1)
    with pytest.raises(ValueError, match="Unknown option 'clip_ratio_c'"):
        policy_loss("cispo", logp, old, adv, mask, clip_ratio_c=3.0)


# ----------------------------------------------------------------------------- entropy bonus, trained tokens


@pytest.mark.parametrize(
    "agg, value, grads",
    [
        # H = [[1, 2], [3, pad]]: token_mean -0.1 * 6/3 = -0.2, dl/dH = -0.1/3 per token
        ("token_mean", -0.2, [[-0.1 / 3, -0.1 / 3], [-0.1 / 3, 0.0]]),
        # seq_mean -0.1 * mean(1.5, 3) = -0.225; dl/dH = -0.1/(2*2) on row 0, -0.1/(1*2) on row 1
        ("seq_mean", -0.225, [[-0.025, -0.025], [-0.05, 0.0]]),
    ],
)
def test_entropy_bonus_is_minus_coef_times_the_entropy_aggregated_like_the_loss(agg, value, grads):
    logp = _leaf([[-1.0, -2.0], [-0.5, float("-inf")]])
    entropy = _leaf([[1.0, 2.0], [3.0, 7.0]])  # 7.0 is padding
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.zeros(2, dtype=D)  # the surrogate is 0: the loss is the bonus alone
    loss, stats = policy_loss("pg", logp, logp.detach(), adv, mask, agg=agg, entropy=entropy, entropy_coef=0.1)
    loss.backward()
    assert loss.item() == pytest.approx(value, abs=1e-12) and stats["loss/entropy"] == pytest.approx(value)
    torch.testing.assert_close(entropy.grad, torch.tensor(grads, dtype=D), atol=1e-12, rtol=0)
    off, off_stats = policy_loss("pg", logp.detach(), logp.detach(), adv, mask, agg=agg, entropy=entropy)
    assert off.item() == 0.0 and "loss/entropy" not in off_stats  # entropy_coef 0: no term
    with pytest.raises(ValueError, match="entropy_coef"):
        policy_loss("pg", logp, logp.detach(), adv, mask, entropy_coef=0.1)


def test_train_tokens_zero_the_surrogate_elsewhere_and_keep_the_normaliser():
    # pg value -A per token; kept (0,0) with A=1 and (1,1) with A=2: (-1 - 2) / 4 tokens = -0.75
    logp = _leaf([[-1.0, -1.0], [-1.0, -1.0]])
    keep = torch.tensor([[True, False], [False, True]])
    loss, stats = policy_loss(
        "pg", logp, logp.detach(), torch.tensor([1.0, 2.0], dtype=D), torch.ones(2, 2), train_tokens=keep
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.75, abs=1e-12) and stats["policy/entropy_trained_frac"] == pytest.approx(0.5)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, 0.0], [0.0, -0.5]], dtype=D), atol=1e-12, rtol=0)
