"""Distillation losses: per-token divergences between a student's and a teacher's next-token distributions.

Knowledge distillation (RLHF book eq. 146; Hinton et al. 2015) trains the student on the teacher's full
distribution at every position of fixed sequences, with a temperature tau > 1 softening both:

    forward KL    KL(p_T || p_S) = sum_v p_T(v) (log p_T(v) - log p_S(v)),   p = softmax(logits / tau),

times tau^2 so that gradient magnitudes do not shrink with tau (Hinton's convention). Its gradient equals that of
the book's cross-entropy -sum_v p_T(v) log p_S(v) (they differ by the teacher's entropy, a constant).

On-policy distillation (Agarwal et al. 2024, "GKD"; Thinking Machines 2025) scores the student's own samples with
the reverse KL, mode-seeking like RL:

    reverse KL    KL(p_S || p_T) = sum_v p_S(v) (log p_S(v) - log p_T(v))   (tau = 1),

computed exactly over the vocabulary at each sampled prefix (no sampling-gradient term: GKD's estimator).

All functions are pure: logits (N, T, V) of both models at the same positions, fp32 inside.
"""

from __future__ import annotations

from typing import Literal

import torch

Direction = Literal["forward", "reverse"]
DIRECTIONS = ("forward", "reverse")

__all__ = ["DIRECTIONS", "Direction", "token_kl"]


def token_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, direction: Direction, temperature: float = 1.0
) -> torch.Tensor:
    """Per-position KL (N, T) between softmax(student / tau) and softmax(teacher / tau): ``forward`` is
    KL(teacher || student) * tau^2, ``reverse`` KL(student || teacher) * tau^2. Gradients reach the student only."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"token_kl: student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} differ; both models must share the vocabulary."
        )
    if direction not in DIRECTIONS:
        raise ValueError(f"token_kl: direction must be one of {DIRECTIONS}, got {direction!r}.")
    if not temperature > 0:
        raise ValueError(f"token_kl: temperature must be > 0, got {temperature}.")
    log_s = torch.log_softmax(student_logits.float() / temperature, dim=-1)  # (N, T, V)
    log_t = torch.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)  # (N, T, V)
    if direction == "forward":
        kl = (log_t.exp() * (log_t - log_s)).sum(dim=-1)
    else:
        kl = (log_s.exp() * (log_s - log_t)).sum(dim=-1)
    return kl * temperature**2
