"""Distillation divergences against values computed by hand."""

import math

import pytest
import torch

from lmrl.algorithms.distill import token_kl


def logits_of(*probs):
    return torch.tensor([[list(p) for p in probs]]).log()  # (1, T, V)


def test_forward_and_reverse_kl_by_hand():
    student, teacher = logits_of((0.5, 0.5)), logits_of((0.9, 0.1))
    forward = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)  # KL(T || S) = 0.368064
    reverse = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)  # KL(S || T) = 0.510826
    assert token_kl(student, teacher, "forward").item() == pytest.approx(forward, abs=1e-6)
    assert token_kl(student, teacher, "reverse").item() == pytest.approx(reverse, abs=1e-6)
    assert token_kl(teacher, teacher, "reverse").item() == pytest.approx(0.0, abs=1e-7)


def test_temperature_softens_both_and_scales_by_its_square():
    # tau = 2: softmax(log p / 2) = sqrt(p) normalised: teacher (0.9, 0.1) -> (0.75, 0.25); student stays (0.5, 0.5)
    student, teacher = logits_of((0.5, 0.5)), logits_of((0.9, 0.1))
    expected = 4 * (0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5))  # 0.523248
    assert token_kl(student, teacher, "forward", temperature=2.0).item() == pytest.approx(expected, abs=1e-6)


def test_gradient_reaches_the_student_only_and_per_position_shape():
    student = torch.randn(2, 3, 5, requires_grad=True)
    teacher = torch.randn(2, 3, 5, requires_grad=True)
    kl = token_kl(student, teacher, "forward")
    assert kl.shape == (2, 3) and (kl >= 0).all()
    kl.sum().backward()
    assert student.grad is not None and teacher.grad is None
    # d KL(T||S) / d z_S = p_S - p_T
    torch.testing.assert_close(student.grad, student.softmax(-1) - teacher.softmax(-1))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="share the vocabulary"):
        token_kl(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), "forward")
    with pytest.raises(ValueError, match="direction"):
        token_kl(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), "sideways")
