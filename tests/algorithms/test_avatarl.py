"""Tests of lmrl.algorithms.avatarl against hand computations from spec/avatarl.md §1.2."""

import math

import pytest
import torch

from lmrl.algorithms.avatarl import AvatarlOptions, avatarl_rewards
from lmrl.algorithms.avatarl_reinforce import avatarl_loss

# --- The hand-built example: one position, V = 6, k = 2 ------------------------------
# Student logits S = [3, 2, 0.5, 0, -1, -2]          -> student top-2 = {0, 1}
# Critic p_m = [0.1, 0.5, 0.3, 0.05, 0.03, 0.02] (sums to 1), C = log p_m
#                                                    -> critic top-2 = {1, 2}
# Gold y = 3. Slots [gold, student top-2, critic top-2] = [3, 0, 1, 1, 2];
# slot 3 repeats slot 2 -> mask [1, 1, 1, 0, 1], A = {3, 0, 1, 2}, |A| = 4.
# ε = 0.3 (so that the two thresholds keep different sets), w_r = 0.7, w_m = 0.3.
# Reality: p_r(3) = 1 - 0.3 = 0.7; p_r(0) = p_r(1) = p_r(2) = 0.3 / 3 = 0.1.
# q(a) = p_r^0.7 · p_m^0.3, with 0.7^0.7 = 0.779056, 0.1^0.7 = 0.199526,
#   0.05^0.3 = 0.407091, 0.1^0.3 = 0.501187, 0.5^0.3 = 0.812252, 0.3^0.3 = 0.696845:
#   q(3) = 0.779056·0.407091 = 0.317146     q(0) = 0.199526·0.501187 = 0.100000
#   q(1) = 0.199526·0.812252 = 0.162066     q(2) = 0.199526·0.696845 = 0.139039
#   s = 0.718251
# q̂ = q/s: q̂(3) = 0.441554, q̂(0) = 0.139227, q̂(1) = 0.225639, q̂(2) = 0.193580.
# Threshold "sum_over_size": τ = s/|A| = 0.179563 -> keep {3, 1, 2}.
#   r = 100·q̂ = [44.16, -, 22.56, 19.36], max 44.16 > 1.5 -> r = 1.5·q̂/q̂(3):
#   r(3) = 1.5, r(1) = 1.5·0.225639/0.441554 = 0.766518, r(2) = 1.5·0.193580/0.441554 = 0.657609
# Threshold "mean": τ = 1/4 = 0.25 -> keep {3}; r(3) = 44.16 -> clamped to 1.5.
HAND_S = [3.0, 2.0, 0.5, 0.0, -1.0, -2.0]
HAND_PM = [0.1, 0.5, 0.3, 0.05, 0.03, 0.02]
HAND_GOLD = 3
HAND_ACTIONS = [3, 0, 1, 1, 2]
HAND_MASK = [True, True, True, False, True]


def hand_inputs():
    student = torch.tensor(HAND_S).view(1, 1, 6)
    critic = torch.tensor(HAND_PM).log().view(1, 1, 6)
    targets = torch.tensor([[HAND_GOLD]])
    return student, critic, targets


def random_inputs(batch=3, seq=40, vocab=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(batch, seq, vocab, generator=g) * 2
    critic = torch.randn(batch, seq, vocab, generator=g) * 2
    targets = torch.randint(0, vocab, (batch, seq), generator=g)
    return student, critic, targets


@pytest.mark.parametrize(
    "threshold, expected",
    [
        ("sum_over_size", [1.5, 0.0, 0.766518, 0.0, 0.657609]),
        ("mean", [1.5, 0.0, 0.0, 0.0, 0.0]),
    ],
)
def test_hand_example_rewards(threshold, expected):
    student, critic, targets = hand_inputs()
    out = avatarl_rewards(student, critic, targets, top_k=2, epsilon=0.3, threshold=threshold)
    assert out.actions[0, 0].tolist() == HAND_ACTIONS
    assert out.mask[0, 0].tolist() == HAND_MASK
    torch.testing.assert_close(out.rewards[0, 0], torch.tensor(expected), atol=2e-6, rtol=0)
    assert out.active_size.item() == 4
    assert out.gold_reward.item() == pytest.approx(1.5, abs=1e-6)
    assert out.num_rewarded.item() == (3 if threshold == "sum_over_size" else 1)


def test_hand_example_unclamped_reward_is_scaled_share():
    # reward_clamp=None: r = 100·q̂ on kept tokens = [44.1554, -, 22.5639, 19.3580] (see header).
    student, critic, targets = hand_inputs()
    out = avatarl_rewards(student, critic, targets, top_k=2, epsilon=0.3, reward_clamp=None)
    torch.testing.assert_close(
        out.rewards[0, 0], torch.tensor([44.1554, 0.0, 22.5639, 0.0, 19.3580]), atol=2e-4, rtol=0
    )


def test_hand_example_default_epsilon():
    # ε = 0.1: p_r(3) = 0.9, others 0.1/3. q(3) = 0.9^0.7·0.05^0.3 = 0.928902·0.407091 = 0.378147,
    # q(0) = (1/30)^0.7·0.1^0.3 = 0.092473·0.501187 = 0.046346, q(1) = 0.092473·0.812252 = 0.075111,
    # q(2) = 0.092473·0.696845 = 0.064439; s = 0.564044; τ = s/4 = 0.141011.
    # q̂ = [0.670421, 0.082168, 0.133166, 0.114245]: only gold is above τ -> r = [1.5, 0, 0, 0, 0].
    student, critic, targets = hand_inputs()
    out = avatarl_rewards(student, critic, targets, top_k=2, epsilon=0.1, reward_clamp=None)
    torch.testing.assert_close(out.rewards[0, 0], torch.tensor([67.0421, 0.0, 0.0, 0.0, 0.0]), atol=2e-4, rtol=0)


def test_single_action_set():
    # k = 1 and both models' top-1 is the gold token 1 -> A = {1}, |A| = 1, p_r(1) = 1.
    # q(1) = 1^0.7 · p_m(1)^0.3, s = q(1), q̂(1) = 1.
    # "sum_over_size": τ = s/1 = p_m(1)^0.3 < 1 = q̂ -> r = 100 -> clamped to 1.5.
    # "mean": τ = 1/1 = 1, and 1 > 1 is false -> no reward (strictly above the mean).
    student = torch.tensor([0.0, 3.0, 1.0]).view(1, 1, 3)
    critic = torch.tensor([0.0, 2.0, 1.0]).view(1, 1, 3)
    targets = torch.tensor([[1]])
    code = avatarl_rewards(student, critic, targets, top_k=1)
    assert code.mask[0, 0].tolist() == [True, False, False]
    assert code.rewards[0, 0].tolist() == [1.5, 0.0, 0.0]
    mean = avatarl_rewards(student, critic, targets, top_k=1, threshold="mean")
    assert mean.rewards[0, 0].tolist() == [0.0, 0.0, 0.0]


def reference_set(student_row, critic_row, gold, k, critic_topk=True):
    ids = {gold} | set(student_row.topk(k).indices.tolist())
    if critic_topk:
        ids |= set(critic_row.topk(k).indices.tolist())
    return ids


@pytest.mark.parametrize("case", ["random", "gold_in_student_topk", "student_equals_critic"])
def test_active_set_is_deduplicated_union_with_gold(case):
    k, vocab = 4, 12
    student, critic, targets = random_inputs(batch=3, seq=60, vocab=vocab, seed=1)
    if case == "gold_in_student_topk":
        targets = student.topk(k, dim=-1).indices[..., 2]  # gold is the student's 3rd choice
    if case == "student_equals_critic":
        critic = student.clone()  # both top-k coincide: |A| = k or k+1
    out = avatarl_rewards(student, critic, targets, top_k=k)
    assert out.actions.shape == (3, 60, 2 * k + 1)
    assert (out.active_size <= 2 * k + 1).all()
    assert (out.actions[..., 0] == targets).all() and out.mask[..., 0].all()
    for b in range(3):
        for t in range(60):
            valid = out.actions[b, t][out.mask[b, t]].tolist()
            assert len(valid) == len(set(valid))
            assert set(valid) == reference_set(student[b, t], critic[b, t], int(targets[b, t]), k)
            assert (out.rewards[b, t][~out.mask[b, t]] == 0).all()
    if case == "gold_in_student_topk":
        assert (out.active_size <= 2 * k).all()
    if case == "student_equals_critic":
        assert set(out.active_size.unique().tolist()) <= {k, k + 1}


def test_critic_topk_off_uses_student_topk_and_gold():
    k = 3
    student, critic, targets = random_inputs(batch=2, seq=30, vocab=10, seed=2)
    out = avatarl_rewards(student, critic, targets, top_k=k, critic_topk=False)
    assert out.actions.shape == (2, 30, k + 1)
    for b in range(2):
        for t in range(30):
            valid = set(out.actions[b, t][out.mask[b, t]].tolist())
            assert valid == reference_set(student[b, t], critic[b, t], int(targets[b, t]), k, critic_topk=False)


@pytest.mark.parametrize("threshold", ["sum_over_size", "mean"])
def test_gradient_is_proportional_to_cross_entropy(threshold):
    # ε = 0 and w_m = 0: q(gold) = 1^0.7 = 1, q(a≠gold) = 0^0.7 = 0 -> q̂ = one-hot(gold),
    # s = 1, τ = 1/|A| in both modes, so only gold is kept; r(gold) = 100 -> clamp -> 1.5.
    # With β = 0, L = (1/N) Σ_t -(1.5/|A_t|) log π(y_t), and d(-log π(y))/dS = π - e_y, so
    #   dL/dS_t = (1.5/|A_t|) · (π_t - e_y)/N = (1.5/|A_t|) · dCE_mean/dS_t   (exact, per position).
    # |A_t| varies with t, so the whole-batch gradients are only parallel (cosine 1) when all
    # |A_t| are equal; the exact statement is the per-position factor 1.5/|A_t|.
    student, critic, targets = random_inputs(batch=2, seq=25, vocab=9, seed=3)
    student.requires_grad_(True)
    opts = dict(top_k=3, epsilon=0.0, mentor_weight=0.0, entropy_coef=0.0, threshold=threshold)
    out = avatarl_rewards(student, critic, targets, **opts)
    loss, _ = avatarl_loss(student, out.actions, out.mask, out.rewards, **opts)
    (grad,) = torch.autograd.grad(loss, student)
    ce = torch.nn.functional.cross_entropy(student.reshape(-1, 9), targets.reshape(-1))
    (grad_ce,) = torch.autograd.grad(ce, student)
    factor = (1.5 / out.active_size.float()).unsqueeze(-1)  # (B, T, 1)
    torch.testing.assert_close(grad, factor * grad_ce, atol=1e-7, rtol=1e-5)
    assert out.active_size.unique().numel() > 1  # the factor really varies across positions


def test_temperature_mode_gradient_matches_spec_formula():
    # Spec §1.2.9: with π_T = softmax(S/T), T = 1+β and no entropy term, the gradient of
    # L_t = -(Σ_A r·log π_T(a))/|A| w.r.t. S_t is (Σr·π_T - r_vec)/(|A|·T), and L = mean_t L_t.
    student, critic, targets = random_inputs(batch=2, seq=20, vocab=11, seed=4)
    student.requires_grad_(True)
    out = avatarl_rewards(student, critic, targets, top_k=3)
    loss, _ = avatarl_loss(student, out.actions, out.mask, out.rewards, entropy_mode="temperature")
    (grad,) = torch.autograd.grad(loss, student)
    temp = 1.01
    r_vec = torch.zeros(2, 20, 11).scatter_add_(-1, out.actions, out.rewards)  # (B, T, V)
    pi_t = torch.softmax(student.detach() / temp, -1)
    size = out.active_size.float().unsqueeze(-1)
    expected = (r_vec.sum(-1, keepdim=True) * pi_t - r_vec) / (size * temp) / 40
    torch.testing.assert_close(grad, expected, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("threshold, pg", [("sum_over_size", 2.036033), ("mean", 1.283200)])
def test_hand_example_loss_with_entropy_bonus(threshold, pg):
    # log π = S - logsumexp(S), logsumexp([3, 2, .5, 0, -1, -2]) = 3.421867:
    #   log π = [-0.421867, -1.421867, -2.921867, -3.421867, -4.421867, -5.421867]
    # H = -Σ π log π = 0.965809.
    # sum_over_size: pg = -(1.5·(-3.421867) + 0.766518·(-1.421867) + 0.657609·(-2.921867))/4 = 2.036033
    # mean:          pg = -(1.5·(-3.421867))/4 = 1.283200
    # loss = pg - 0.01·0.965809
    student, critic, targets = hand_inputs()
    out = avatarl_rewards(student, critic, targets, top_k=2, epsilon=0.3, threshold=threshold)
    loss, stats = avatarl_loss(student, out.actions, out.mask, out.rewards)
    assert loss.item() == pytest.approx(pg - 0.01 * 0.965809, abs=2e-6)
    assert stats["avatarl/pg_loss"] == pytest.approx(pg, abs=2e-6)
    assert stats["avatarl/entropy"] == pytest.approx(0.965809, abs=2e-6)
    assert stats["avatarl/gold_reward"] == pytest.approx(1.5, abs=1e-6)
    assert stats["avatarl/active_size"] == 4.0
    assert stats["avatarl/rewarded_per_position"] == (3.0 if threshold == "sum_over_size" else 1.0)
    # reward_mean over the 4 valid actions: (1.5 + 0 + 0.766518 + 0.657609)/4 = 0.731032, or 1.5/4
    expected_mean = 0.731032 if threshold == "sum_over_size" else 0.375
    assert stats["avatarl/reward_mean"] == pytest.approx(expected_mean, abs=2e-6)
    assert stats["avatarl/reward_max"] == pytest.approx(1.5, abs=1e-6)


def test_temperature_mode_hand_loss():
    # T = 1.01: S/T = [2.970297, 1.980198, 0.495050, 0, -0.990099, -1.980198],
    # logsumexp(S/T) = 3.397593 -> log π_T(3) = -3.397593, log π_T(1) = 1.980198 - 3.397593 = -1.417394,
    # log π_T(2) = 0.495050 - 3.397593 = -2.902543.
    # pg = -(1.5·(-3.397593) + 0.766518·(-1.417394) + 0.657609·(-2.902543))/4 = 2.022896, no H term.
    student, critic, targets = hand_inputs()
    out = avatarl_rewards(student, critic, targets, top_k=2, epsilon=0.3)
    loss, stats = avatarl_loss(student, out.actions, out.mask, out.rewards, entropy_mode="temperature")
    assert loss.item() == pytest.approx(2.022896, abs=2e-6)
    assert stats["avatarl/entropy"] == pytest.approx(0.965809, abs=2e-6)  # of softmax(S), logged only


@pytest.mark.parametrize("entropy_mode", ["bonus", "temperature"])
def test_chunked_equals_unchunked(entropy_mode):
    student, critic, targets = random_inputs(batch=3, seq=37, vocab=50, seed=5)
    targets[0, :5] = -100
    results = []
    for chunk_size in (None, 7, 1000):
        s = student.clone().requires_grad_(True)
        out = avatarl_rewards(s, critic, targets, top_k=5, chunk_size=chunk_size)
        loss, stats = avatarl_loss(
            s, out.actions, out.mask, out.rewards, chunk_size=chunk_size, entropy_mode=entropy_mode
        )
        loss.backward()
        results.append((out, loss.detach(), s.grad, stats))
    ref = results[0]
    for out, loss, grad, stats in results[1:]:
        assert torch.equal(out.actions, ref[0].actions) and torch.equal(out.mask, ref[0].mask)
        assert torch.equal(out.rewards, ref[0].rewards)
        assert torch.equal(loss, ref[1])
        assert torch.equal(grad, ref[2])
        assert stats == ref[3]


@pytest.mark.parametrize("entropy_mode", ["bonus", "temperature"])
def test_chunked_gradient_passes_gradcheck(entropy_mode):
    # The chunked backward (gradient assembled in the forward pass) against finite differences, fp64.
    student, critic, targets = random_inputs(batch=2, seq=4, vocab=7, seed=10)
    targets[1, 2] = -100
    out = avatarl_rewards(student, critic, targets, top_k=2)
    rewards = out.rewards.double()

    def loss_fn(logits):
        return avatarl_loss(logits, out.actions, out.mask, rewards, chunk_size=3, entropy_mode=entropy_mode)[0]

    assert torch.autograd.gradcheck(loss_fn, (student.double().requires_grad_(True),), eps=1e-6, atol=1e-7)


def test_backward_scales_with_upstream_gradient():
    student, critic, targets = random_inputs(batch=1, seq=5, vocab=6, seed=11)
    out = avatarl_rewards(student, critic, targets, top_k=2)
    grads = []
    for scale in (1.0, -2.5):
        s = student.clone().requires_grad_(True)
        (scale * avatarl_loss(s, out.actions, out.mask, out.rewards, chunk_size=2)[0]).backward()
        grads.append(s.grad)
    torch.testing.assert_close(grads[1], -2.5 * grads[0], atol=0, rtol=1e-6)


def test_ignore_index_positions_contribute_nothing():
    student, critic, targets = random_inputs(batch=2, seq=10, vocab=8, seed=6)
    targets[0, 3:7] = -100
    targets[1, 0] = -100
    ignored = targets == -100
    out = avatarl_rewards(student, critic, targets, top_k=2)
    assert not out.mask[ignored].any() and (out.rewards[ignored] == 0).all()
    assert (out.active_size[ignored] == 0).all() and out.mask[~ignored][:, 0].all()
    s = student.clone().requires_grad_(True)
    loss, stats = avatarl_loss(s, out.actions, out.mask, out.rewards)
    loss.backward()
    assert (s.grad[ignored] == 0).all() and (s.grad[~ignored] != 0).any()
    # Scrambling the logits of ignored positions changes neither the loss nor the rewards.
    scrambled = student.clone()
    scrambled[ignored] = torch.randn(int(ignored.sum()), 8) * 10
    out2 = avatarl_rewards(scrambled, critic, targets, top_k=2)
    assert torch.equal(out2.rewards[~ignored], out.rewards[~ignored])
    loss2, stats2 = avatarl_loss(scrambled, out.actions, out.mask, out.rewards)
    assert loss2.item() == pytest.approx(loss.item(), abs=1e-6)
    assert stats2["avatarl/active_size"] == pytest.approx(stats["avatarl/active_size"])
    # The loss is the mean over the 15 kept positions, not over all 20.
    pg_sum = sum(
        -(out.rewards[b, t] * torch.log_softmax(student[b, t], -1)[out.actions[b, t]]).sum() / out.active_size[b, t]
        - 0.01 * torch.distributions.Categorical(logits=student[b, t]).entropy()
        for b in range(2)
        for t in range(10)
        if not ignored[b, t]
    )
    assert loss.item() == pytest.approx(float(pg_sum) / 15, abs=1e-5)


def test_all_positions_ignored_gives_zero_loss_with_graph():
    student, critic, _ = random_inputs(batch=1, seq=4, vocab=6, seed=7)
    targets = torch.full((1, 4), -100)
    student.requires_grad_(True)
    out = avatarl_rewards(student, critic, targets, top_k=2)
    loss, stats = avatarl_loss(student, out.actions, out.mask, out.rewards)
    loss.backward()
    assert loss.item() == 0.0 and (student.grad == 0).all() and stats["avatarl/active_size"] == 0.0


def test_rewards_carry_no_gradient():
    student, critic, targets = random_inputs(batch=1, seq=3, vocab=6, seed=8)
    out = avatarl_rewards(student.requires_grad_(True), critic.requires_grad_(True), targets, top_k=2)
    assert not out.rewards.requires_grad and out.rewards.dtype == torch.float32


def test_top_k_larger_than_vocab_refused():
    student, critic, targets = random_inputs(batch=1, seq=2, vocab=5)
    with pytest.raises(ValueError, match=r"top_k=6.*vocabulary size 5"):
        avatarl_rewards(student, critic, targets, top_k=6)
    avatarl_rewards(student, critic, targets, top_k=5)  # k == V is allowed


def test_vocab_mismatch_refused_naming_both_sizes():
    student, _, targets = random_inputs(batch=1, seq=2, vocab=5)
    critic = torch.randn(1, 2, 7)
    with pytest.raises(ValueError, match=r"critic's vocabulary \(7 logits.*student's \(5 logits\)"):
        avatarl_rewards(student, critic, targets, top_k=2)


def test_bad_inputs_and_options_refused():
    student, critic, targets = random_inputs(batch=1, seq=2, vocab=5)
    with pytest.raises(ValueError, match="outside"):
        avatarl_rewards(student, critic, torch.tensor([[1, 5]]), top_k=2)
    with pytest.raises(ValueError, match="unknown avatarl option"):
        avatarl_rewards(student, critic, targets, topk=2)
    with pytest.raises(ValueError, match="epsilon=1.0"):
        AvatarlOptions(epsilon=1.0)
    with pytest.raises(ValueError, match="threshold"):
        AvatarlOptions(threshold="median")
    with pytest.raises(ValueError, match="same \\(B, T\\)"):
        avatarl_rewards(student, critic[:, :1], targets, top_k=2)
    out = avatarl_rewards(student, critic, targets, top_k=2)
    with pytest.raises(ValueError, match="mask must be"):
        avatarl_loss(student, out.actions, out.mask[..., :2], out.rewards)


def test_options_object_and_overrides():
    student, critic, targets = hand_inputs()
    opts = AvatarlOptions(top_k=2, epsilon=0.3, threshold="mean")
    assert opts.num_slots == 5 and AvatarlOptions(top_k=2, critic_topk=False).num_slots == 3
    via_object = avatarl_rewards(student, critic, targets, opts)
    via_override = avatarl_rewards(student, critic, targets, opts, threshold="sum_over_size")
    assert via_object.num_rewarded.item() == 1 and via_override.num_rewarded.item() == 3


def test_bfloat16_logits_are_accepted():
    student, critic, targets = random_inputs(batch=1, seq=6, vocab=10, seed=9)
    out32 = avatarl_rewards(student.bfloat16().float(), critic.bfloat16().float(), targets, top_k=3)
    out16 = avatarl_rewards(student.bfloat16(), critic.bfloat16(), targets, top_k=3)
    assert torch.equal(out16.rewards, out32.rewards)
    s = student.bfloat16().requires_grad_(True)
    loss, _ = avatarl_loss(s, out16.actions, out16.mask, out16.rewards)
    loss.backward()
    assert s.grad.dtype == torch.bfloat16 and math.isfinite(loss.item())
