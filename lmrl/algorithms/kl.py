"""Per-token estimators of KL(pi || pi_ref) from tokens sampled from pi, and KL-shaped rewards.

With r = pi_ref(y_t)/pi(y_t) (so log r = ref_logp - logp), Schulman's estimators
(http://joschu.net/blog/kl-approx.html, cited as [126] in the RLHF book; book
§7 of the spec and ch. 15): k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregation import check_mask
from .registry import Registry

KL_ESTIMATORS = Registry("KL estimator")

LOG_RATIO_CLAMP = 20.0  # |log r| cap in k3: exp(20) ~ 5e8 keeps exp finite in fp32/bf16


@KL_ESTIMATORS.register("k1")
def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = logp - ref_logp = -log r: unbiased, can be negative (Schulman 2020; RLHF book ch. 15)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = 0.5 (logp - ref_logp)^2: >= 0, biased, low variance (Schulman 2020; book approx_kl)."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = (r - 1) - log r, r = exp(ref_logp - logp): unbiased and >= 0 (Schulman 2020).

    log r is clamped to [-20, 20] so exp stays finite (gradient is 0 beyond the clamp).
    """
    log_r = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_r) - 1.0 - log_r


def kl(logp: Tensor, ref_logp: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token estimate (N, T) of KL(pi || pi_ref) with estimator "k1", "k2" or "k3".

    `logp` and `ref_logp` are the log-probs of the sampled tokens under pi and pi_ref.
    The result is not masked: reduce it with `aggregate` or `masked_mean`.
    """
    fn = KL_ESTIMATORS.get(estimator)
    if not isinstance(logp, Tensor) or not isinstance(ref_logp, Tensor) or logp.shape != ref_logp.shape:
        raise ValueError(
            "kl: `logp` and `ref_logp` must be tensors of the same shape (per-token log-probs of "
            f"the sampled tokens), got {getattr(logp, 'shape', logp)} and "
            f"{getattr(ref_logp, 'shape', ref_logp)}."
        )
    return fn(logp, ref_logp)


def kl_penalized_rewards(rewards: Tensor, kl_tok: Tensor, mask: Tensor, beta: float) -> Tensor:
    """Per-token rewards (N, T) with the KL in the reward (PPO/RLOO style; RLHF book §6.1, §6.2).

    r_{i,t} = -beta * kl_{i,t} on every completion token, plus the scalar reward R_i on
    the last completion token of row i; 0 off the mask. The result is detached (a reward).
    """
    m = check_mask(mask, kl_tok)
    if rewards.shape != (kl_tok.shape[0],):
        raise ValueError(
            f"kl_penalized_rewards: `rewards` must be (N,) = ({kl_tok.shape[0]},) to match the "
            f"N rows of `kl_tok`, got {tuple(rewards.shape)}."
        )
    if not beta >= 0:
        raise ValueError(f"kl_penalized_rewards: `beta` (KL coefficient) must be >= 0, got {beta!r}.")
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)  # (N, T)
    last = torch.where(m, positions, -1).amax(dim=1)  # (N,) index of the last completion token
    if bool((last < 0).any()):
        empty = torch.nonzero(last < 0).flatten().tolist()
        raise ValueError(
            f"kl_penalized_rewards: rows {empty} have no completion token in `mask`, so their "
            "reward has no token to land on. Drop empty completions or keep their EOS token in "
            "the mask."
        )
    out = (-beta * kl_tok.detach().float()).masked_fill(~m, 0.0)  # (N, T)
    return out.scatter_add(1, last[:, None], rewards.detach().float()[:, None])
