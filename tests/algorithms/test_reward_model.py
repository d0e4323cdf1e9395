"""Reward-model losses against values computed by hand from their formulas.

sp(x) = log(1 + eˣ), so −log σ(x) = sp(−x). Hand constants:
    sp(−1) = 0.3132616875, sp(1) = 1.3132616875, sp(−2) = 0.1269280110,
    sp(−3) = 0.0485873516, sp(−0.5) = 0.4740769842, sp(0) = log 2 = 0.6931471806
"""

import pytest
import torch

from lmrl.algorithms.reward_model import REWARD_MODEL_LOSSES, reward_model_loss
from tests.helpers import HAND_TOL as TOL
from tests.helpers import float64 as t
from tests.helpers import float64_scalar as scalar


def test_bt_hand_value():
    # r_c − r_r = (2 − 1, 0 − 1) = (1, −1): mean(sp(−1), sp(1)) = (0.3132616875 + 1.3132616875)/2
    loss = reward_model_loss("bt", {"chosen_scores": t(2.0, 0.0), "rejected_scores": t(1.0, 1.0)})
    torch.testing.assert_close(loss, scalar(0.8132616875182228), **TOL)


def test_bt_margin_hand_value():
    # margin (0.5, 0): pair 0: sp(−(1 − 0.5)) = sp(−0.5) = 0.4740769842
    #                  pair 1: sp(1) = 1.3132616875
    # mean = 0.8936693358
    batch = {"chosen_scores": t(2.0, 0.0), "rejected_scores": t(1.0, 1.0), "margin": t(0.5, 0.0)}
    torch.testing.assert_close(reward_model_loss("bt", batch), scalar(0.8936693358491647), **TOL)
    # a scalar margin of 0 is the plain BT loss
    batch["margin"] = 0.0
    torch.testing.assert_close(reward_model_loss("bt", batch), scalar(0.8132616875182228), **TOL)


def test_bt_center_coef_hand_value():
    # (r_c + r_r)² = (3², 1²) = (9, 1), mean 5; c = 0.01 adds 0.05: 0.8132616875 + 0.05
    batch = {"chosen_scores": t(2.0, 0.0), "rejected_scores": t(1.0, 1.0)}
    loss = reward_model_loss("bt", batch, center_coef=0.01)
    torch.testing.assert_close(loss, scalar(0.8632616875182228), **TOL)


def test_bt_gradient_raises_chosen_and_lowers_rejected():
    # d/dr_c of mean(sp(r_r − r_c)) = −σ(r_r − r_c)/B
    # pair 0: −σ(−1)/2 = −0.2689414214/2 = −0.1344707107
    chosen, rejected = t(2.0, 0.0).requires_grad_(), t(1.0, 1.0).requires_grad_()
    reward_model_loss("bt", {"chosen_scores": chosen, "rejected_scores": rejected}).backward()
    torch.testing.assert_close(chosen.grad[0], scalar(-0.13447071068499755), **TOL)
    torch.testing.assert_close(rejected.grad[0], scalar(0.13447071068499755), **TOL)


def test_bt_kwise_hand_value():
    # scores best first (3, 1, 0): pairs (3,1) sp(−2), (3,0) sp(−3), (1,0) sp(−1)
    # (0.1269280110 + 0.0485873516 + 0.3132616875)/3 = 0.4887770501/3 = 0.1629256834
    loss = reward_model_loss("bt_kwise", {"scores": t(3.0, 1.0, 0.0).unsqueeze(0)})
    torch.testing.assert_close(loss, scalar(0.16292568337831248), **TOL)


def test_bt_kwise_with_ranking_matches_sorted_scores():
    # row 0 (0, 3, 1) with ranking (1, 2, 0) is (3, 1, 0) best first: 0.1629256834 (above)
    # row 1 (5, 5, 5): every pair is sp(0) = log 2 = 0.6931471806; mean over rows = 0.4280364320
    batch = {
        "scores": torch.tensor([[0.0, 3.0, 1.0], [5.0, 5.0, 5.0]], dtype=torch.float64),
        "ranking": torch.tensor([[1, 2, 0], [2, 0, 1]]),
    }
    loss = reward_model_loss("bt_kwise", batch)
    torch.testing.assert_close(loss, scalar(0.4280364319691289), **TOL)


def test_bt_kwise_with_k2_equals_bt():
    scores = torch.tensor([[2.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    bt = reward_model_loss("bt", {"chosen_scores": scores[:, 0], "rejected_scores": scores[:, 1]})
    torch.testing.assert_close(reward_model_loss("bt_kwise", {"scores": scores}), bt, **TOL)


def test_plackett_luce_k3_hand_value():
    # scores best first (3, 1, 0):
    # k=0: 3 − log(e³ + e + 1) = 3 − log(23.8038187516) = 3 − 3.1698460196
    # k=1: 1 − log(e + 1) = 1 − 1.3132616875;  k=2: 0 − log(e⁰) = 0
    # NLL = 0.1698460196 + 0.3132616875 = 0.4831077071
    loss = reward_model_loss("plackett_luce", {"scores": t(3.0, 1.0, 0.0).unsqueeze(0)})
    torch.testing.assert_close(loss, scalar(0.4831077070745085), **TOL)


def test_plackett_luce_k2_equals_bt():
    # K = 2: −[r_0 − log(e^r_0 + e^r_1)] − 0 = −log σ(r_0 − r_1), the BT loss
    scores = torch.randn(16, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    bt = reward_model_loss("bt", {"chosen_scores": scores[:, 0], "rejected_scores": scores[:, 1]})
    torch.testing.assert_close(reward_model_loss("plackett_luce", {"scores": scores}), bt, **TOL)
    # and by hand on one pair (2, 1): sp(−1) = 0.3132616875
    loss = reward_model_loss("plackett_luce", {"scores": t(2.0, 1.0).unsqueeze(0)})
    torch.testing.assert_close(loss, scalar(0.31326168751822286), **TOL)


def test_plackett_luce_uses_ranking():
    # (0, 3, 1) ranked (1, 2, 0) is (3, 1, 0) best first: 0.4831077071 as above
    batch = {"scores": t(0.0, 3.0, 1.0).unsqueeze(0), "ranking": torch.tensor([[1, 2, 0]])}
    loss = reward_model_loss("plackett_luce", batch)
    torch.testing.assert_close(loss, scalar(0.4831077070745085), **TOL)
    batch["ranking"] = batch["ranking"].int()  # any integer dtype
    loss = reward_model_loss("plackett_luce", batch)
    torch.testing.assert_close(loss, scalar(0.4831077070745085), **TOL)


def test_orm_hand_value_and_ignores_masked_positions():
    # labelled: logit 2, y=1 → sp(−2) = 0.1269280110; logit −1, y=1 → sp(1) = 1.3132616875;
    # logit 0, y=0 → sp(0) = 0.6931471806; mean over 3 = 2.1333368791/3 = 0.7111122930
    logits = torch.tensor([[0.0, 2.0, -1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([[-100, 1, 1], [-100, 0, -100]])
    loss = reward_model_loss("orm", {"logits": logits, "labels": labels})
    torch.testing.assert_close(loss, scalar(0.7111122930403803), **TOL)
    # changing logits at -100 positions changes nothing, and they get no gradient
    noisy = logits.clone()
    noisy[labels == -100] = 1e3
    noisy.requires_grad_()
    loss = reward_model_loss("orm", {"logits": noisy, "labels": labels})
    torch.testing.assert_close(loss, scalar(0.7111122930403803), **TOL)
    loss.backward()
    assert torch.all(noisy.grad[labels == -100] == 0)
    assert torch.all(noisy.grad[labels != -100] != 0)


def test_prm_hand_value_and_ignores_masked_positions():
    # step at t=1: logits (0, 0, 0), class 2 → −log(1/3) = log 3 = 1.0986122887
    # step at t=2: logits (log 2, 0, 0), class 0 → −log(2/4) = log 2 = 0.6931471806
    # mean = 0.8958797346; t=0 has label -100 and huge logits that must not matter
    logits = torch.tensor(
        [[[50.0, -50.0, 9.0], [0.0, 0.0, 0.0], [0.6931471805599453, 0.0, 0.0]]], dtype=torch.float64
    ).requires_grad_()
    labels = torch.tensor([[-100, 2, 0]])
    loss = reward_model_loss("prm", {"logits": logits, "labels": labels})
    torch.testing.assert_close(loss, scalar(0.8958797346140275), **TOL)
    loss.backward()
    assert torch.all(logits.grad[0, 0] == 0)


def test_every_entry_is_documented():
    assert set(REWARD_MODEL_LOSSES) == {"bt", "bt_kwise", "plackett_luce", "orm", "prm"}
    for name in REWARD_MODEL_LOSSES:
        assert REWARD_MODEL_LOSSES.get(name).__doc__


def test_unknown_name_and_option_raise():
    batch = {"chosen_scores": t(1.0), "rejected_scores": t(0.0)}
    with pytest.raises(ValueError, match="Unknown reward-model loss 'btt'"):
        reward_model_loss("btt", batch)
    with pytest.raises(ValueError, match="'margin'"):
        reward_model_loss("bt", batch, margin=1.0)  # margin is a batch field, not an option


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="'rejected_scores'"):
        reward_model_loss("bt", {"chosen_scores": t(1.0)})
    with pytest.raises(ValueError, match="squeeze"):
        column = torch.zeros(2, 1)
        reward_model_loss("bt", {"chosen_scores": column, "rejected_scores": column})
    with pytest.raises(ValueError, match="margin"):
        reward_model_loss(
            "bt", {"chosen_scores": t(1.0, 2.0), "rejected_scores": t(0.0, 0.0), "margin": t(1.0, 2.0, 3.0)}
        )
    with pytest.raises(ValueError, match="permutation"):
        reward_model_loss(
            "plackett_luce", {"scores": t(1.0, 2.0, 3.0).unsqueeze(0), "ranking": torch.tensor([[0, 0, 1]])}
        )
    with pytest.raises(ValueError, match="K >= 2"):
        reward_model_loss("bt_kwise", {"scores": t(1.0).unsqueeze(0)})
    with pytest.raises(ValueError, match="0 or 1"):
        reward_model_loss("orm", {"logits": torch.zeros(1, 2), "labels": torch.tensor([[2, -100]])})
    with pytest.raises(ValueError, match="every label is -100"):
        unlabelled = torch.tensor([[-100, -100]])
        reward_model_loss("orm", {"logits": torch.zeros(1, 2), "labels": unlabelled})
    with pytest.raises(ValueError, match=r"class ids in \[0, 3\)"):
        out_of_range = torch.tensor([[3, -100]])
        reward_model_loss("prm", {"logits": torch.zeros(1, 2, 3), "labels": out_of_range})
    with pytest.raises(ValueError, match="same shape"):
        reward_model_loss("orm", {"logits": torch.zeros(1, 3), "labels": torch.tensor([[1, -100]])})
