"""Tests for lmrl.algorithms.registry and lmrl.algorithms.advantages (hand values in comments)."""

import inspect
import math
import re

import pytest
import torch

from lmrl.algorithms import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
    advantages,
    gae,
    group_stats,
    whiten,
    zero_variance_groups,
)
from lmrl.algorithms.registry import check_options

D = torch.float64

# 2 prompts x 3 samples, prompt-major: group 0 = [1, 0, 0], group 1 = [2, 4, 9].
R = torch.tensor([1.0, 0.0, 0.0, 2.0, 4.0, 9.0], dtype=D)


# ----------------------------------------------------------------------------- Registry


def test_registry_register_and_get():
    reg = Registry("thing")

    @reg.register("a")
    def a():
        """Formula a (source)."""

    assert reg.get("a") is a and "a" in reg and reg.names() == ("a",) and len(reg) == 1
    assert reg.register("a")(a) is a  # re-registering the same function is a no-op


def test_registry_miss_suggests_closest_and_lists_names():
    with pytest.raises(ValueError) as err:
        ADVANTAGES.get("grop")
    msg = str(err.value)
    assert "Did you mean 'grpo'?" in msg
    for name in ("reinforce", "rloo", "grpo", "dr_grpo"):
        assert repr(name) in msg
    with pytest.raises(ValueError, match="Unknown advantage estimator"):
        ADVANTAGES.get(None)


def test_registry_refuses_a_different_function_under_a_taken_name():
    reg = Registry("thing")

    @reg.register("a")
    def a():
        """Formula a."""

    def other():
        """Formula b."""

    with pytest.raises(ValueError, match="already taken"):
        reg.register("a")(other)
    assert reg.get("a") is a


def test_registry_refuses_undocumented_functions():
    reg = Registry("thing")
    with pytest.raises(ValueError, match="docstring"):
        reg.register("x")(lambda: None)


@pytest.mark.parametrize("registry", [ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES])
def test_every_registered_function_documents_a_source(registry):
    for name in registry:
        doc = inspect.getdoc(registry.get(name))
        # a source is a book section or a paper year
        assert re.search(r"book|\d{4}", doc), f"{registry.kind} {name!r} docstring lacks a source"


def test_check_options_suggests_spelling():
    check_options("x", {"eps": 1}, ("eps", "scale"))
    with pytest.raises(ValueError, match="Did you mean 'scale'"):
        check_options("x", {"scael": 1}, ("eps", "scale"))


# ----------------------------------------------------------------------------- estimators


def test_grpo_group_scale():
    # group 0: mean 1/3, centred [2/3, -1/3, -1/3], unbiased var (4/9+1/9+1/9)/2 = 1/3
    # group 1: mean 5, centred [-3, -1, 4], unbiased var (9+1+16)/2 = 13
    s0, s1 = math.sqrt(1 / 3) + 1e-4, math.sqrt(13) + 1e-4
    want = torch.tensor([2 / 3 / s0, -1 / 3 / s0, -1 / 3 / s0, -3 / s1, -1 / s1, 4 / s1], dtype=D)
    # e.g. 2/3 / (0.577350 + 1e-4) = 1.154501
    assert advantages("grpo", R, 3)[0].item() == pytest.approx(1.154501, abs=1e-6)
    torch.testing.assert_close(advantages("grpo", R, 3), want, atol=1e-9, rtol=0)
    torch.testing.assert_close(advantages("grpo", R, 3, scale="group", eps=1e-4), want, atol=1e-9, rtol=0)


def test_grpo_batch_scale():
    # batch: mean 16/6 = 8/3; squared deviations 25/9+64/9+64/9+4/9+16/9+361/9 = 534/9
    # unbiased var = 534/9/5 = 11.8667, std = 3.444803; centring stays per group
    s = math.sqrt(534 / 45) + 1e-4
    want = torch.tensor([2 / 3, -1 / 3, -1 / 3, -3, -1, 4], dtype=D) / s
    torch.testing.assert_close(advantages("grpo", R, 3, scale="batch"), want, atol=1e-9, rtol=0)


def test_grpo_no_scale_equals_dr_grpo():
    want = torch.tensor([2 / 3, -1 / 3, -1 / 3, -3.0, -1.0, 4.0], dtype=D)
    torch.testing.assert_close(advantages("grpo", R, 3, scale="none"), want, atol=1e-12, rtol=0)
    torch.testing.assert_close(advantages("dr_grpo", R, 3), want, atol=1e-12, rtol=0)


def test_grpo_eps_keeps_zero_variance_groups_finite():
    # group [1, 1, 1]: centred 0, std 0 -> 0 / (0 + eps) = 0
    out = advantages("grpo", torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0]), 3)
    assert torch.isfinite(out).all() and (out[:3] == 0).all()


def test_rloo_leave_one_out():
    # group 0: 1 - (0+0)/2 = 1; 0 - (1+0)/2 = -0.5 (x2)
    # group 1: 2 - (4+9)/2 = -4.5; 4 - (2+9)/2 = -1.5; 9 - (2+4)/2 = 6
    want = torch.tensor([1.0, -0.5, -0.5, -4.5, -1.5, 6.0], dtype=D)
    got = advantages("rloo", R, 3)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    # = K/(K-1) (r - group mean) = 1.5 * [2/3, -1/3, -1/3, -3, -1, 4]
    torch.testing.assert_close(got, 1.5 * advantages("dr_grpo", R, 3), atol=1e-12, rtol=0)


def test_rloo_random_matches_formula():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(4 * 5, generator=g, dtype=D)
    grp = r.view(4, 5)
    loo = torch.stack([torch.cat([grp[:, :k], grp[:, k + 1 :]], 1).mean(1) for k in range(5)], 1)
    torch.testing.assert_close(advantages("rloo", r, 5), (grp - loo).reshape(-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(advantages("rloo", r, 5), 5 / 4 * advantages("dr_grpo", r, 5), atol=1e-12, rtol=0)


def test_rloo_refuses_group_size_one_and_says_why():
    with pytest.raises(ValueError, match=r"group_size >= 2.*OTHER samples"):
        advantages("rloo", torch.tensor([1.0, 0.0]), 1)


def test_reinforce_batch_mean_baseline():
    # batch mean 8/3: [1, 0, 0, 2, 4, 9] - 8/3
    want = torch.tensor([-5 / 3, -8 / 3, -8 / 3, -2 / 3, 4 / 3, 19 / 3], dtype=D)
    torch.testing.assert_close(advantages("reinforce", R, 3), want, atol=1e-12, rtol=0)
    torch.testing.assert_close(advantages("reinforce", R, 1), want, atol=1e-12, rtol=0)


def test_integer_rewards_are_accepted_as_float():
    out = advantages("dr_grpo", torch.tensor([1, 0, 1, 1]), 2)
    assert out.is_floating_point()
    torch.testing.assert_close(out, torch.tensor([0.5, -0.5, 0.0, 0.0]))


@pytest.mark.parametrize(
    "rewards, group_size, opts, match",
    [
        (torch.zeros(2, 3), 3, {}, "1-D"),
        (torch.zeros(5), 2, {}, "cannot be split"),
        (torch.tensor([1.0, float("nan")]), 2, {}, "NaN"),
        (torch.zeros(4), 0, {}, "group_size"),
        (torch.zeros(4), 2, {"scale": "grup"}, "scale"),
        (torch.zeros(4), 2, {"epss": 1e-4}, "Did you mean 'eps'"),
        (torch.zeros(4), 1, {}, "group_size >= 2"),  # grpo group std of one sample
        (torch.zeros(4), 2, {"eps": -1.0}, "eps"),
    ],
)
def test_grpo_bad_input(rewards, group_size, opts, match):
    with pytest.raises(ValueError, match=match):
        advantages("grpo", rewards, group_size, **opts)


def test_estimators_without_options_reject_options():
    with pytest.raises(ValueError, match="Unknown option 'eps'"):
        advantages("rloo", R, 3, eps=1e-4)


def test_zero_variance_groups_and_group_stats():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert zero_variance_groups(r, 3).tolist() == [True, False, True]
    stats = group_stats(r, 3)
    # group 1 = [0, 1, 0]: mean 1/3, unbiased var (1/9 + 4/9 + 1/9)/2 = 1/3
    torch.testing.assert_close(stats["mean"], torch.tensor([1.0, 1 / 3, 0.0]))
    torch.testing.assert_close(stats["std"], torch.tensor([0.0, math.sqrt(1 / 3), 0.0]))
    assert stats["zero_variance"].tolist() == [True, False, True]
    assert group_stats(r, 1)["std"].tolist() == [0.0] * 9


# ----------------------------------------------------------------------------- GAE


def test_gae_hand_example_with_terminal_and_padding():
    # gamma = 0.9, lam = 0.8, gamma*lam = 0.72; last masked token is terminal (V after it = 0)
    # row 0, 3 tokens, r = [0, 0, 1], V = [0.5, 0.6, 0.7]:
    #   t2: d = 1 - 0.7 = 0.3                         A2 = 0.3
    #   t1: d = 0 + 0.9*0.7 - 0.6 = 0.03              A1 = 0.03 + 0.72*0.3 = 0.246
    #   t0: d = 0 + 0.9*0.6 - 0.5 = 0.04              A0 = 0.04 + 0.72*0.246 = 0.21712
    #   returns = A + V = [0.71712, 0.846, 1.0]
    # row 1, 2 tokens + padding holding garbage (r=100, V=50) that must not leak:
    #   t1: d = 2 - 0.5 = 1.5                         A1 = 1.5
    #   t0: d = 0.9*0.5 - 1.0 = -0.55                 A0 = -0.55 + 0.72*1.5 = 0.53
    #   returns = [1.53, 2.0, 0]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 100.0]], dtype=D)
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 0.5, 50.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(
        adv.double(), torch.tensor([[0.21712, 0.246, 0.3], [0.53, 1.5, 0.0]], dtype=D), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        ret.double(), torch.tensor([[0.71712, 0.846, 1.0], [1.53, 2.0, 0.0]], dtype=D), atol=1e-6, rtol=0
    )


def test_gae_skips_masked_gaps_inside_a_sequence():
    # mask [1, 0, 1] (e.g. a tool output in the middle); the gap's r=7, V=9 are ignored.
    #   t2: d = 1 - 0.4 = 0.6                 A2 = 0.6
    #   t0: d = 0.9*0.4 - 0.2 = 0.16          A0 = 0.16 + 0.72*0.6 = 0.592
    adv, ret = gae(
        torch.tensor([[0.0, 7.0, 1.0]]), torch.tensor([[0.2, 9.0, 0.4]]), torch.tensor([[1.0, 0.0, 1.0]]), 0.9, 0.8
    )
    torch.testing.assert_close(adv, torch.tensor([[0.592, 0.0, 0.6]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[0.792, 0.0, 1.0]]), atol=1e-6, rtol=0)


def test_gae_lambda_one_gamma_one_is_monte_carlo():
    # A_t = sum_{s>=t} r_s - V_t: r = [1, 2, 3] -> reward-to-go [6, 5, 3]; V = [1, 1, 1] -> [5, 4, 2]
    adv, ret = gae(torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3), torch.ones(1, 3), 1.0, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[5.0, 4.0, 2.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[6.0, 5.0, 3.0]]), atol=1e-6, rtol=0)


def _gae_loop_reference(rewards, values, mask, gamma, lam):
    """Book recurrence (RLHF book §6.3) run per row over that row's real tokens only."""
    adv = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        idx = [t for t in range(rewards.shape[1]) if mask[i, t]]
        running, next_v = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[i, t].item() + gamma * next_v - values[i, t].item()
            running = delta + gamma * lam * running
            adv[i, t] = running
            next_v = values[i, t].item()
    return adv, adv + values * mask


def test_gae_matches_loop_reference_on_random_unequal_lengths():
    g = torch.Generator().manual_seed(1)
    n, t_len = 6, 9
    rewards = torch.randn(n, t_len, generator=g, dtype=D)
    values = torch.randn(n, t_len, generator=g, dtype=D)
    mask = torch.zeros(n, t_len, dtype=D)
    for i, (start, length) in enumerate([(0, 9), (0, 1), (2, 5), (0, 4), (3, 6), (1, 7)]):
        mask[i, start : start + length] = 1.0  # left padding, right padding, full, single token
    mask[5, 4] = 0.0  # a gap inside row 5
    adv, ret = gae(rewards, values, mask, gamma=0.97, lam=0.9)
    want_adv, want_ret = _gae_loop_reference(rewards, values, mask, 0.97, 0.9)
    torch.testing.assert_close(adv.double(), want_adv, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret.double(), want_ret, atol=1e-5, rtol=0)


def test_gae_outputs_are_detached_targets():
    values = torch.randn(2, 3, requires_grad=True)
    adv, ret = gae(torch.randn(2, 3), values, torch.ones(2, 3))
    assert not adv.requires_grad and not ret.requires_grad


def test_gae_bad_input():
    with pytest.raises(ValueError, match="values"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="gamma"):
        gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), gamma=1.5)
    with pytest.raises(ValueError, match="NaN"):
        gae(torch.full((1, 2), float("nan")), torch.zeros(1, 2), torch.ones(1, 2))


# ----------------------------------------------------------------------------- whiten


def test_whiten_masks_padding():
    # real entries 1..5: mean 3, unbiased var (4+1+0+1+4)/4 = 2.5, std 1.5811388
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 1000.0, -7.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    s = math.sqrt(2.5) + 1e-8
    want = torch.tensor([[-2 / s, -1 / s, 0.0, 0.0], [1 / s, 2 / s, 0.0, 0.0]], dtype=D)
    torch.testing.assert_close(whiten(x, mask), want, atol=1e-9, rtol=0)
    want_shift = (want + 3.0) * mask
    torch.testing.assert_close(whiten(x, mask, shift_mean=False), want_shift, atol=1e-9, rtol=0)


def test_whiten_with_all_sum_whitens_a_split_batch_as_one():
    """A batch split over processes: all_sum sums each part's count, sum and squared deviations. Two equal halves
    make every sum twice the half's, so all_sum = 2x gives the whole batch's whitening (the half alone differs)."""
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 9.0, 1000.0, -7.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    whole = whiten(torch.cat([x, x]), torch.cat([mask, mask]))[:2]
    torch.testing.assert_close(whiten(x, mask, all_sum=lambda t: 2 * t), whole, atol=1e-12, rtol=0)
    assert not torch.allclose(whiten(x, mask), whole)  # the unbiased std of a half differs from the whole's


def test_whiten_without_mask_uses_all_entries():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=D)
    torch.testing.assert_close(whiten(x), (x - 3.0) / (math.sqrt(2.5) + 1e-8), atol=1e-9, rtol=0)


def test_whiten_needs_two_entries():
    with pytest.raises(ValueError, match="at least 2"):
        whiten(torch.ones(1, 3), torch.tensor([[1, 0, 0]]))


def test_reinforce_pp_normalises_by_the_whole_batch_without_a_group_baseline():
    # rewards 1 0 | 0 1 | 1 1 (G = 2): batch mean 2/3; deviations 1/3 -2/3 -2/3 1/3 1/3 1/3,
    # squares sum 12/9 -> unbiased var 4/15, std 0.516398; A = (r - 2/3) / std
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    std = math.sqrt(4 / 15)
    expected = torch.tensor([1 / 3, -2 / 3, -2 / 3, 1 / 3, 1 / 3, 1 / 3], dtype=torch.float64) / (std + 1e-8)
    torch.testing.assert_close(advantages("reinforce_pp", rewards, 2), expected, atol=1e-12, rtol=0)
    # the all-correct group still gets a positive advantage (a group baseline, as in GRPO, gives it 0)
    assert advantages("grpo", rewards, 2)[4:].abs().max() == 0.0
    assert advantages("reinforce_pp", rewards, 1).tolist() == advantages("reinforce_pp", rewards, 6).tolist()
    with pytest.raises(ValueError, match="at least 2 rewards"):
        advantages("reinforce_pp", torch.tensor([1.0]), 1)
