"""DPO-family losses against values computed by hand from their formulas.

Notation in comments: u = logπ − logπref (summed), h = u_c − u_r,
sp(x) = log(1 + eˣ) = −log σ(−x), so −log σ(x) = sp(−x).
Hand constants used below:
    sp(−0.2) = log(1 + e^−0.2) = log(1.8187307531) = 0.5981388694
    sp(0.2)  = log(1 + e^0.2)  = log(2.2214027582) = 0.7981388694   (= sp(−0.2) + 0.2)
    σ(0.2)   = 1 / (1 + e^−0.2) = 0.5498339973,  σ(−0.2) = 0.4501660027
"""

import math

import pytest
import torch

from lmrl.algorithms.preference import (
    PREFERENCE_LOSSES,
    kto_reference_kl,
    preference_loss,
    preference_stats,
)
from tests.helpers import HAND_TOL as TOL
from tests.helpers import float64 as t
from tests.helpers import float64_scalar as scalar


def paired_batch():
    """Two pairs.

    pair 0: u_c = −5 − (−6) = 1,   u_r = −8 − (−7) = −1,  h = 2,  |yc| = 2, |yr| = 4
    pair 1: u_c = −10 − (−9) = −1, u_r = −9 − (−10) = 1,  h = −2, |yc| = 5, |yr| = 3
    """
    return {
        "chosen": t(-5.0, -10.0),
        "rejected": t(-8.0, -9.0),
        "ref_chosen": t(-6.0, -9.0),
        "ref_rejected": t(-7.0, -10.0),
        "chosen_len": torch.tensor([2, 5]),
        "rejected_len": torch.tensor([4, 3]),
    }


def test_dpo_hand_values():
    # β = 0.1: βh = 0.2, −0.2 → −log σ(0.2) = sp(−0.2), −log σ(−0.2) = sp(0.2)
    loss = preference_loss("dpo", paired_batch(), beta=0.1)
    torch.testing.assert_close(loss, t(0.5981388693815918, 0.7981388693815918), **TOL)


def test_dpo_default_beta_is_0_1():
    torch.testing.assert_close(preference_loss("dpo", paired_batch()), preference_loss("dpo", paired_batch(), beta=0.1))


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
    # dL/d logπ(yc) = −β·σ(−βh) = −0.1·σ(−0.2) = −0.0450166003 (pair 0);
    # dL/d logπ(yr) = +0.0450166003. Gradient descent raises chosen, lowers rejected.
    batch = paired_batch()
    batch["chosen"] = batch["chosen"].clone().requires_grad_()
    batch["rejected"] = batch["rejected"].clone().requires_grad_()
    preference_loss("dpo", batch, beta=0.1)[0].backward()
    torch.testing.assert_close(batch["chosen"].grad, t(-0.04501660026875222, 0.0), **TOL)
    torch.testing.assert_close(batch["rejected"].grad, t(0.04501660026875222, 0.0), **TOL)


def test_cdpo_hand_values_and_zero_smoothing_is_dpo():
    # ε = 0.25: pair 0: 0.75·sp(−0.2) + 0.25·sp(0.2) = 0.4486041520 + 0.1995347173 = 0.6481388694
    #           pair 1: 0.75·sp(0.2) + 0.25·sp(−0.2) = 0.5986041520 + 0.1495347173 = 0.7481388694
    loss = preference_loss("cdpo", paired_batch(), beta=0.1, label_smoothing=0.25)
    torch.testing.assert_close(loss, t(0.6481388693815918, 0.7481388693815918), **TOL)
    torch.testing.assert_close(
        preference_loss("cdpo", paired_batch(), beta=0.3, label_smoothing=0.0),
        preference_loss("dpo", paired_batch(), beta=0.3),
        **TOL,
    )


def test_robust_hand_values():
    # ε = 0.25: pair 0: (0.75·sp(−0.2) − 0.25·sp(0.2)) / 0.5 = (0.4486041520 − 0.1995347173)/0.5
    #                   = 0.4981388694;  pair 1: (0.5986041520 − 0.1495347173)/0.5 = 0.8981388694
    loss = preference_loss("robust", paired_batch(), beta=0.1, label_smoothing=0.25)
    torch.testing.assert_close(loss, t(0.4981388693815918, 0.8981388693815919), **TOL)


def test_ipo_length_normalised_hand_values():
    # τ = 0.5 → target 1/(2τ) = 1.
    # pair 0: u_c/2 − u_r/4 = 0.5 + 0.25 = 0.75 → (0.75 − 1)² = 0.0625
    # pair 1: u_c/5 − u_r/3 = −0.2 − 0.3333… = −0.5333… → (−1.5333…)² = 2.3511111…
    loss = preference_loss("ipo", paired_batch(), tau=0.5)
    torch.testing.assert_close(loss, t(0.0625, 2.351111111111111), **TOL)


def test_ipo_summed_hand_values():
    # τ = 0.5, summed h: pair 0: (2 − 1)² = 1; pair 1: (−2 − 1)² = 9
    loss = preference_loss("ipo", paired_batch(), tau=0.5, length_normalize=False)
    torch.testing.assert_close(loss, t(1.0, 9.0), **TOL)


def test_ipo_minimum_has_zero_loss_and_zero_gradient():
    # τ = 0.25 → target 2. u_c/|yc| − u_r/|yr| = (−4+10)/3 − (−9+9)/1 = 2 → loss 0, grad 0.
    batch = {
        "chosen": t(-4.0).requires_grad_(),
        "rejected": t(-9.0).requires_grad_(),
        "ref_chosen": t(-10.0),
        "ref_rejected": t(-9.0),
        "chosen_len": torch.tensor([3]),
        "rejected_len": torch.tensor([1]),
    }
    loss = preference_loss("ipo", batch, tau=0.25)
    torch.testing.assert_close(loss, t(0.0), **TOL)
    loss.sum().backward()
    torch.testing.assert_close(batch["chosen"].grad, t(0.0), **TOL)
    torch.testing.assert_close(batch["rejected"].grad, t(0.0), **TOL)


def test_hinge_hand_values():
    # β = 0.1: max(0, 1 − 0.2) = 0.8, max(0, 1 + 0.2) = 1.2; β = 1: max(0, 1 − 2) = 0, max(0, 3) = 3
    loss = preference_loss("hinge", paired_batch(), beta=0.1)
    torch.testing.assert_close(loss, t(0.8, 1.2), **TOL)
    loss = preference_loss("hinge", paired_batch(), beta=1.0)
    torch.testing.assert_close(loss, t(0.0, 3.0), **TOL)


def test_simpo_hand_values():
    # β = 2, γ = 0.5:
    # pair 0: 2·(−5/2) − 2·(−8/4) − 0.5 = −5 + 4 − 0.5 = −1.5
    #         → sp(1.5) = log(5.4816890703) = 1.7014132780
    # pair 1: 2·(−10/5) − 2·(−9/3) − 0.5 = −4 + 6 − 0.5 = 1.5
    #         → sp(−1.5) = log(1.2231301601) = 0.2014132780
    loss = preference_loss("simpo", paired_batch(), beta=2.0, gamma=0.5)
    torch.testing.assert_close(loss, t(1.7014132779827524, 0.2014132779827524), **TOL)


def test_simpo_needs_no_reference_and_is_length_normalised():
    # Doubling every summed log-prob and every length keeps the per-token means, so SimPO
    # is unchanged; DPO (summed) is not.
    batch = paired_batch()
    no_ref = {k: v for k, v in batch.items() if not k.startswith("ref_")}
    doubled = {k: 2 * v for k, v in batch.items()}
    torch.testing.assert_close(preference_loss("simpo", no_ref), preference_loss("simpo", doubled), **TOL)
    assert not torch.allclose(preference_loss("dpo", batch), preference_loss("dpo", doubled))


def orpo_batch():
    # chosen mean log-prob −2·log2 / 2 = −log 2 → P = 1/2, odds = 1, log odds = 0
    # rejected mean log-prob −3·log4 / 3 = −log 4 → P = 1/4, odds = 1/3, log odds = −log 3
    return {
        "chosen": t(-2 * math.log(2)),
        "rejected": t(-3 * math.log(4)),
        "chosen_len": torch.tensor([2]),
        "rejected_len": torch.tensor([3]),
    }


def test_orpo_hand_value():
    # log odds ratio = 0 − (−log 3) = log 3; −log σ(log 3) = −log(3/4) = log(4/3) = 0.2876820725
    # NLL(yc) = log 2 = 0.6931471806; L = 0.6931471806 + 0.1·0.2876820725 = 0.7219153878
    loss = preference_loss("orpo", orpo_batch(), lam=0.1)
    torch.testing.assert_close(loss, t(0.7219153878051233), **TOL)


def test_orpo_uses_given_chosen_nll():
    # chosen_nll = 1.5 replaces log 2: L = 1.5 + 0.1·log(4/3) = 1.5287682072
    batch = orpo_batch() | {"chosen_nll": t(1.5)}
    loss = preference_loss("orpo", batch, lam=0.1)
    torch.testing.assert_close(loss, t(1.5287682072451781), **TOL)


def test_orpo_log_odds_are_accurate_for_probabilities_near_one():
    # float32, mean log-probs a_c = −1e-7, a_r = −2e-7 (probabilities ≈ 1).
    # log odds(a) = a − log(1 − eᵃ) ≈ a/2 − log(−a) for small |a|, so
    # log odds ratio ≈ (a_c − a_r)/2 − log(a_c/a_r) = 5e-8 + log 2 = 0.6931472306
    # L = NLL + λ·sp(−ratio) = 1e-7 + log(1 + 1/2) − 5e-8/3 = 0.4054651914 (λ = 1).
    # A naive log(1 − exp(a)) in float32 gives 0.5108 here (1 − e^−1e-7 rounds badly).
    batch = {
        "chosen": torch.tensor([-1e-7]),
        "rejected": torch.tensor([-2e-7]),
        "chosen_len": torch.tensor([1]),
        "rejected_len": torch.tensor([1]),
    }
    loss = preference_loss("orpo", batch, lam=1.0)
    torch.testing.assert_close(loss, torch.tensor([0.4054651914]), rtol=0, atol=1e-5)


def test_orpo_gradient_is_finite_when_a_probability_rounds_to_one():
    # float32: e^(−1e-8) rounds to 1.0, so an unclamped log1p(−eˣ) branch would be −inf and
    # poison the gradient through torch.where even though that branch is not selected.
    batch = {
        "chosen": torch.tensor([-1e-8], requires_grad=True),
        "rejected": torch.tensor([-3.0], requires_grad=True),
        "chosen_len": torch.tensor([1]),
        "rejected_len": torch.tensor([1]),
    }
    preference_loss("orpo", batch).sum().backward()
    assert torch.isfinite(batch["chosen"].grad).all()
    assert torch.isfinite(batch["rejected"].grad).all()


def test_dpo_nll_hand_values():
    # β = 0.1, α = 1: pair 0: sp(−0.2) + 5/2 = 3.0981388694; pair 1: sp(0.2) + 10/5 = 2.7981388694
    loss = preference_loss("dpo_nll", paired_batch(), beta=0.1, alpha=1.0)
    torch.testing.assert_close(loss, t(3.0981388693815918, 2.7981388693815918), **TOL)
    # α = 0.5 with a given chosen_nll (e.g. over CoT + answer): sp(−0.2) + 0.5·4 = 2.5981388694
    batch = paired_batch() | {"chosen_nll": t(4.0, 0.0)}
    loss = preference_loss("dpo_nll", batch, beta=0.1, alpha=0.5)
    torch.testing.assert_close(loss, t(2.5981388693815918, 0.7981388693815918), **TOL)


def test_odpo_hand_values():
    # s_c − s_r = 2 for both pairs → Δ = α·log 2 = 0.6931471806 (α = 1)
    # pair 0: −log σ(0.2 − log 2) = log(1 + 2e^−0.2) = log(2.6374615062) = 0.9698169039
    # pair 1: −log σ(−0.2 − log 2) = log(1 + 2e^0.2) = log(3.4428055163) = 1.2362866961
    batch = paired_batch() | {"chosen_score": t(3.0, 5.0), "rejected_score": t(1.0, 3.0)}
    loss = preference_loss("odpo", batch, beta=0.1, alpha=1.0)
    torch.testing.assert_close(loss, t(0.969816903873296, 1.2362866960692136), **TOL)
    # α = 0 removes the offset: ODPO = DPO
    torch.testing.assert_close(
        preference_loss("odpo", batch, beta=0.1, alpha=0.0), preference_loss("dpo", batch), **TOL
    )


def test_bco_hand_value():
    # β = 0.1, δ = 0.05; pair 0: βu_c = 0.1, βu_r = −0.1
    # −log σ(0.1 − 0.05) − log σ(0.05 + 0.1) = sp(−0.05) + sp(−0.15)
    #   = log(1.9512294245) + log(1.8607079764) = 0.6684596480 + 0.6209570478 = 1.2894166958
    batch = paired_batch() | {"delta": scalar(0.05)}
    loss = preference_loss("bco", batch, beta=0.1)
    torch.testing.assert_close(loss[0], scalar(1.2894166958028184), **TOL)
    # without delta (δ = 0): sp(−0.1) + sp(−0.1) = 2·0.6443966600 = 1.2887933200
    loss0 = preference_loss("bco", paired_batch(), beta=0.1)
    torch.testing.assert_close(loss0[0], scalar(1.2887933201471418), **TOL)


def test_cal_dpo_hand_values():
    # β = 0.5 → targets ±1/(2β) = ±1.
    # pair 0: u = (1, −1): sp(−2) + ½[(1−1)² + (−1+1)²] = log(1 + e^−2) = 0.1269280110
    # pair 1: u = (−1, 1): sp(2) + ½[(−2)² + (2)²] = 2.1269280110 + 4 = 6.1269280110
    loss = preference_loss("cal_dpo", paired_batch(), beta=0.5)
    torch.testing.assert_close(loss, t(0.1269280110429725, 6.126928011042972), **TOL)


def kto_batch(kl_ref):
    # example 0: desirable, r = −3.5 − (−6) = 2.5; example 1: undesirable, r = −9.5 − (−8) = −1.5
    return {
        "logp": t(-3.5, -9.5),
        "ref_logp": t(-6.0, -8.0),
        "label": torch.tensor([1, 0]),
        "kl_ref": kl_ref,
    }


def test_kto_desirable_and_undesirable_hand_values():
    # β = 0.1, λD = 1, λU = 1.5, z0 = 0.5
    # desirable:   v = 1·σ(0.1·(2.5 − 0.5)) = σ(0.2) = 0.5498339973; L = 1 − v = 0.4501660027
    # undesirable: v = 1.5·σ(0.1·(0.5 + 1.5)) = 1.5·σ(0.2) = 0.8247509960;
    #              L = 1.5 − v = 0.6752490040
    loss = preference_loss("kto", kto_batch(0.5), beta=0.1, lambda_d=1.0, lambda_u=1.5)
    torch.testing.assert_close(loss, t(0.45016600268752205, 0.6752490040312831), **TOL)
    # (B,) reference points give the same values
    loss_vec = preference_loss("kto", kto_batch(t(0.5, 0.5)), beta=0.1, lambda_d=1.0, lambda_u=1.5)
    torch.testing.assert_close(loss_vec, loss, **TOL)


def test_kto_clamps_negative_reference_point_and_detaches_it():
    # kl_ref = −2 → z0 = max(0, −2) = 0; desirable: 1 − σ(0.25) = 0.4378234991
    # undesirable: 1 − σ(0.1·(0 + 1.5)) = 1 − σ(0.15) = 0.4625701547
    kl = scalar(-2.0).requires_grad_()
    batch = kto_batch(kl)
    batch["logp"].requires_grad_()
    loss = preference_loss("kto", batch, beta=0.1)
    torch.testing.assert_close(loss, t(0.43782349911420193, 0.46257015465625045), **TOL)
    loss.sum().backward()
    assert batch["logp"].grad is not None
    assert kl.grad is None  # the reference point carries no gradient


def test_kto_reference_kl():
    # mean(logp − ref) = mean(1, −3, 5) = 1; clamped at 0 when negative
    kl = kto_reference_kl(t(-1.0, -5.0, 0.0), t(-2.0, -2.0, -5.0))
    torch.testing.assert_close(kl, scalar(1.0), **TOL)
    kl_neg = kto_reference_kl(t(-9.0), t(-2.0))
    torch.testing.assert_close(kl_neg, scalar(0.0), **TOL)


def test_kto_rejects_bad_labels_and_missing_reference_point():
    batch = kto_batch(0.0) | {"label": torch.tensor([1, 2])}
    with pytest.raises(ValueError, match="label"):
        preference_loss("kto", batch)
    batch = kto_batch(0.0)
    del batch["kl_ref"]
    with pytest.raises(ValueError, match="kl_ref"):
        preference_loss("kto", batch)


def test_preference_stats_hand_values():
    # β = 0.5 on paired_batch(): r̂_c = 0.5·(1, −1) = (0.5, −0.5), r̂_r = 0.5·(−1, 1) = (−0.5, 0.5)
    # plus a third pair with u_c = 3, u_r = 1: r̂_c = 1.5, r̂_r = 0.5 (chosen −2, rejected −4)
    third = {
        "chosen": -2.0,
        "rejected": -4.0,
        "ref_chosen": -5.0,
        "ref_rejected": -5.0,
        "chosen_len": 1,
        "rejected_len": 1,
    }
    batch = {k: torch.cat([v, v.new_tensor([third[k]])]) for k, v in paired_batch().items()}
    stats = preference_stats(batch, beta=0.5)
    # rewards/chosen = (0.5 − 0.5 + 1.5)/3 = 0.5; rewards/rejected = (−0.5 + 0.5 + 0.5)/3 = 1/6
    # margin = (1 − 1 + 1)/3 = 1/3; accuracy = 2/3; logps = (−5 −10 −2)/3, (−8 −9 −4)/3 = −7
    expected = {
        "policy/reward_chosen": 0.5,
        "policy/reward_rejected": 1 / 6,
        "policy/reward_margin": 1 / 3,
        "policy/reward_accuracy": 2 / 3,
        "policy/logp_chosen": -17 / 3,
        "policy/logp_rejected": -7.0,
    }
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, abs=1e-9), key


def test_preference_stats_reference_free():
    # reference taken as 0: r̂ = β·logπ = 0.5·(−5, −10) and 0.5·(−8, −9)
    # rewards/chosen = −3.75, rewards/rejected = −4.25, margin 0.5, accuracy 1/2
    batch = {k: v for k, v in paired_batch().items() if not k.startswith("ref_")}
    stats = preference_stats(batch, beta=0.5, reference_free=True)
    assert stats["policy/reward_chosen"] == pytest.approx(-3.75, abs=1e-9)
    assert stats["policy/reward_rejected"] == pytest.approx(-4.25, abs=1e-9)
    assert stats["policy/reward_margin"] == pytest.approx(0.5, abs=1e-9)
    assert stats["policy/reward_accuracy"] == pytest.approx(0.5, abs=1e-9)
    with pytest.raises(ValueError, match="ref_chosen"):
        preference_stats(batch, beta=0.5)


def test_every_entry_returns_one_loss_per_example_and_is_documented():
    batch = paired_batch() | {"chosen_score": t(2.0, 2.0), "rejected_score": t(1.0, 1.0)}
    for name in PREFERENCE_LOSSES:
        assert PREFERENCE_LOSSES.get(name).__doc__
        if name == "kto":
            continue
        assert preference_loss(name, batch).shape == (2,), name
    assert preference_loss("kto", kto_batch(0.0)).shape == (2,)


def test_unknown_name_and_option_raise():
    with pytest.raises(ValueError, match="Unknown preference loss 'dpoo'"):
        preference_loss("dpoo", paired_batch())
    with pytest.raises(ValueError, match="'betta'"):
        preference_loss("dpo", paired_batch(), betta=0.1)
    with pytest.raises(ValueError, match="'tau'"):
        preference_loss("dpo", paired_batch(), tau=0.1)


def test_bad_batches_raise_clear_errors():
    batch = paired_batch()
    del batch["ref_rejected"]
    with pytest.raises(ValueError, match="'ref_rejected'"):
        preference_loss("dpo", batch)
    batch = paired_batch() | {"rejected": t(-1.0, -2.0, -3.0)}
    with pytest.raises(ValueError, match="same batch size"):
        preference_loss("dpo", batch)
    batch = paired_batch() | {"chosen": torch.zeros(2, 4, dtype=torch.float64)}
    with pytest.raises(ValueError, match="1-D tensor"):
        preference_loss("dpo", batch)
    batch = paired_batch() | {"chosen_len": torch.tensor([0, 3])}
    with pytest.raises(ValueError, match="<= 0"):
        preference_loss("simpo", batch)
    with pytest.raises(ValueError, match="label_smoothing"):
        preference_loss("cdpo", paired_batch(), label_smoothing=0.7)
    with pytest.raises(ValueError, match="beta"):
        preference_loss("dpo", paired_batch(), beta=0.0)
    with pytest.raises(ValueError, match="log-probs"):
        preference_loss("orpo", orpo_batch() | {"chosen": t(0.5)})
    batch = paired_batch() | {"chosen_score": t(1.0, 2.0), "rejected_score": t(1.0, 1.0)}
    with pytest.raises(ValueError, match="chosen_score > rejected_score"):
        preference_loss("odpo", batch)
