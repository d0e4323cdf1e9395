"""Training knobs as pure functions: which tokens are trained, and the coefficients that adapt during a run.

- `overlong_filter`: truncated completions get loss mask 0 (DAPO's overlong filtering).
- `high_entropy_tokens`: only the top-q highest-entropy tokens are trained ("Beyond the 80/20 rule").
- `adaptive_entropy_coef`: the entropy-bonus weight moved by a fixed step towards a target entropy (Skywork-OR1).
- `adaptive_kl_coef`: the KL weight moved towards a target KL (Ziegler et al. 2019's adaptive controller).

Shapes: mask, entropy (N, T) with 1 on trained completion tokens; truncated (N,) bool.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregation import check_mask

KL_ERROR_CLIP = 0.2  # Ziegler et al. 2019: the proportional error is clipped to [-0.2, 0.2]


def overlong_filter(mask: Tensor, truncated: Tensor) -> Tensor:
    """mask_i,t * (1 - truncated_i): completions that hit the length cap are not trained (DAPO overlong filtering,
    Yu et al. 2025, arXiv 2503.14476 §3.4; TRL ``mask_truncated_completions``). Their rewards still count in the
    baselines; a row with mask 0 adds 0 to the loss and to its normaliser. Same dtype as ``mask``."""
    check_mask(mask, mask)
    if not isinstance(truncated, Tensor) or truncated.shape != (mask.shape[0],):
        raise ValueError(
            f"overlong_filter: `truncated` must be a bool tensor (N,) = ({mask.shape[0]},), one flag per "
            f"completion, got {getattr(truncated, 'shape', truncated)}."
        )
    return mask * (~truncated.bool()).to(mask.dtype)[:, None]


def high_entropy_tokens(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """Bool (N, T): the masked tokens whose entropy is in the top ``quantile`` share of the masked tokens' entropies.

    tau = the (1 - q) quantile of {H_t : mask_t = 1} (linear interpolation, `torch.quantile`); keep_t = mask_t and
    H_t >= tau. Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL for LLM
    Reasoning" (arXiv 2506.01939): the policy gradient on the top 20% (q = 0.2) "forking" tokens only matches or
    beats training on every token (TRL ``top_entropy_quantile``). q = 1 keeps every masked token.
    """
    m = check_mask(mask, entropy)
    if not 0.0 < quantile <= 1.0:
        raise ValueError(
            f"high_entropy_tokens: `quantile` must be in (0, 1] (the share of tokens kept), got {quantile!r}."
        )
    if quantile == 1.0 or not bool(m.any()):
        return m.clone()
    values = entropy.detach().float()[m]  # (K,)
    tau = torch.quantile(values, 1.0 - quantile)
    return m & (entropy.detach().float() >= tau)


def adaptive_entropy_coef(coef: float, entropy: float, target: float, step: float) -> float:
    """c_{k+1} = max(0, c_k + step) if H_k < target, max(0, c_k - step) if H_k > target, c_k if equal.

    The adaptive entropy control of Skywork-OR1 (He et al. 2025, arXiv 2505.22312, §3.2.3): H_k is the mean
    entropy of the step's trained tokens, and the entropy bonus -c * H in the loss pushes the entropy up while it
    is below the target. (Skywork also zeroes the bonus while H_k > target; here c only shrinks there.)
    """
    if not (coef >= 0 and step >= 0 and target > 0):
        raise ValueError(
            f"adaptive_entropy_coef: need coef >= 0, step >= 0 and target > 0, got coef={coef!r}, "
            f"step={step!r}, target={target!r}."
        )
    if entropy < target:
        return coef + step
    if entropy > target:
        return max(0.0, coef - step)
    return coef


def adaptive_kl_coef(coef: float, kl: float, target: float, horizon: int, n_steps: int) -> float:
    """beta_{k+1} = beta_k * (1 + clip(KL_k / target - 1, -0.2, 0.2) * n_steps / horizon).

    The adaptive KL controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences",
    arXiv 1909.08593 §2.2; verl ``AdaptiveKLController``, OpenRLHF ``--algo.kl.target``): KL_k is the step's
    measured KL to the reference, n_steps the samples of the step, horizon the samples over which beta may move by
    e^{+-0.2}. Above the target beta grows, below it shrinks.
    """
    if not (coef > 0 and target > 0 and horizon >= 1 and n_steps >= 0):
        raise ValueError(
            f"adaptive_kl_coef: need coef > 0, target > 0, horizon >= 1 and n_steps >= 0, got "
            f"coef={coef!r}, target={target!r}, horizon={horizon!r}, n_steps={n_steps!r}."
        )
    error = min(max(kl / target - 1.0, -KL_ERROR_CLIP), KL_ERROR_CLIP)
    return coef * (1.0 + error * n_steps / horizon)
