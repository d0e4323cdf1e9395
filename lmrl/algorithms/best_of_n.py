"""Best-of-N and rejection-sampling selection, and the KL of best-of-N; pure tensor functions.

Layout: M prompts x N samples, prompt-major (`rewards[i, j]` is sample j of prompt i; a flat index is
k = i*N + j). RLHF book ch. 9 (spec `rlhf-book-advanced.md` §2):
  - per-prompt best: argmax_j r_ij (book eq. 113), here optionally the k best of each prompt;
  - global top-K: argsort(flat R)[-K:], then i = k // N, j = k % N.
Ties go to the lower index (the earlier sample); samples are i.i.d., so this is distributed as a uniform
random choice among the tied ones.

KL of best-of-N. For a reward r(y) and the policy π, let F(r) = P_π(r(Y) <= r) and F⁻(r) = P_π(r(Y) < r).
The best of N i.i.d. samples has reward level r with probability F(r)^N − F⁻(r)^N, and within a level it is
distributed as π, so
    KL(π_BoN ‖ π) = Σ_levels P_BoN(r) log(P_BoN(r) / P_π(r)),   P_BoN(r) = F(r)^N − F⁻(r)^N.
With no ties (a continuous reward) this equals log N − (N−1)/N, the formula quoted by the book (Stiennon et
al. 2020; Gao et al. 2022), which Beirami et al. 2024 ("Theoretical guarantees on the best-of-n alignment
policy") prove is an upper bound for any reward: ties only lower the KL.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _check_rewards(rewards: Tensor, what: str) -> None:
    if not isinstance(rewards, Tensor) or rewards.ndim != 2 or rewards.numel() == 0:
        shape = tuple(rewards.shape) if isinstance(rewards, Tensor) else type(rewards).__name__
        raise ValueError(
            f"{what}: rewards must be a non-empty (M prompts, N samples) tensor, prompt-major, got {shape}. "
            "Reshape a flat (M*N,) tensor with rewards.view(-1, N)."
        )
    if not torch.isfinite(rewards).all():
        raise ValueError(f"{what}: rewards contain NaN or inf; fix the reward function or drop those samples.")


def _eligible_mask(rewards: Tensor, eligible: Tensor | None, what: str) -> Tensor:
    if eligible is None:
        return torch.ones_like(rewards, dtype=torch.bool)
    if eligible.shape != rewards.shape or eligible.dtype != torch.bool:
        raise ValueError(
            f"{what}: eligible must be a bool tensor of the rewards' shape {tuple(rewards.shape)}, got "
            f"{eligible.dtype} {tuple(eligible.shape)}."
        )
    return eligible


def select_best(rewards: Tensor, k: int = 1, eligible: Tensor | None = None) -> Tensor:
    """Flat indices (i*N + j) of the k highest-reward eligible samples of each prompt (book eq. 113 for k=1).

    rewards: (M, N); eligible: optional bool (M, N), False = never selected (truncated, duplicate, below a
    threshold). A prompt with fewer than k eligible samples contributes the ones it has. Returned prompt by
    prompt, best first within a prompt; ties go to the earlier sample.
    """
    _check_rewards(rewards, "select_best")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"select_best: k (samples kept per prompt) must be an int >= 1, got {k!r}.")
    if k > rewards.shape[1]:
        raise ValueError(
            f"select_best: k={k} samples per prompt but only N={rewards.shape[1]} were drawn per prompt; "
            "lower k (per_prompt) or raise samples_per_prompt."
        )
    mask = _eligible_mask(rewards, eligible, "select_best")
    masked = rewards.masked_fill(~mask, float("-inf"))  # (M, N)
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices[:, :k]  # (M, k)
    keep = mask.gather(1, order)  # (M, k): an ineligible sample only appears when a prompt ran out
    flat = order + torch.arange(rewards.shape[0])[:, None] * rewards.shape[1]  # (M, k)
    return flat[keep]


def select_top_k(rewards: Tensor, k: int, eligible: Tensor | None = None) -> Tensor:
    """Flat indices of the k highest-reward eligible samples over ALL prompts (book: argsort(flat R)[-K:]).

    rewards: (M, N); eligible: optional bool (M, N). Best first; ties go to the lower flat index. Raises
    ValueError when fewer than k samples are eligible.
    """
    _check_rewards(rewards, "select_top_k")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"select_top_k: k (samples kept in total) must be an int >= 1, got {k!r}.")
    mask = _eligible_mask(rewards, eligible, "select_top_k")
    available = int(mask.sum())
    if k > available:
        raise ValueError(
            f"select_top_k: top_k={k} but only {available} of the {rewards.numel()} samples are eligible "
            f"({rewards.shape[0]} prompts x {rewards.shape[1]} samples, minus truncated/duplicate/below-threshold "
            "ones); lower top_k or sample more prompts or samples per prompt."
        )
    flat = rewards.reshape(-1).masked_fill(~mask.reshape(-1), float("-inf"))  # (M*N,)
    return torch.sort(flat, descending=True, stable=True).indices[:k]


def bon_kl_bound(n: int) -> float:
    """KL(π_BoN ‖ π) = log N − (N−1)/N: exact for a reward without ties, an upper bound otherwise.

    RLHF book ch. 9 [ext]; Stiennon et al. 2020 (appendix), Beirami et al. 2024 (bound). N=1 gives 0.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"bon_kl_bound: N (samples per prompt) must be an int >= 1, got {n!r}.")
    return math.log(n) - (n - 1) / n


def _levels(rewards: Tensor) -> tuple[Tensor, Tensor]:
    """Per prompt: F(r_j) and F⁻(r_j) of each sample's reward under the empirical distribution of the row.

    rewards: (M, P). Returns two (M, P) tensors: the fraction of the row with reward <= r_j and < r_j.
    """
    r = rewards.double()
    below_or_equal = (r[:, None, :] <= r[:, :, None]).double().mean(-1)  # (M, P): F(r_j)
    below = (r[:, None, :] < r[:, :, None]).double().mean(-1)  # (M, P): F⁻(r_j)
    return below_or_equal, below


def bon_kl_empirical(pool: Tensor, n: int) -> Tensor:
    """Plug-in estimate (M,) of KL(π_BoN ‖ π) per prompt from a pool of P rewards of samples drawn from π.

    The exact KL of best-of-n when π's reward distribution is the pool's empirical one (module docstring):
        KL̂ = Σ_levels (F̂^n − F̂⁻^n) log((F̂^n − F̂⁻^n) / (F̂ − F̂⁻)),
    with F̂, F̂⁻ the pool's fractions of rewards <= and < the level. Consistent as P grows; with few ties it is
    biased low (it is at most log P), and it never exceeds `bon_kl_bound(n)`. pool: (M, P).
    """
    _check_rewards(pool, "bon_kl_empirical")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"bon_kl_empirical: N (samples per prompt) must be an int >= 1, got {n!r}.")
    upper, lower = _levels(pool)  # (M, P) each
    p_level = upper - lower  # (M, P): π̂ mass of the sample's level (> 0)
    p_bon = upper**n - lower**n  # (M, P): best-of-n mass of the level
    # each level appears (count = p_level * P) times in the row: weight each sample by 1/count
    per_sample = torch.where(p_bon > 0, p_bon * torch.log(p_bon / p_level), torch.zeros_like(p_bon))
    count = p_level * pool.shape[1]  # (M, P)
    return (per_sample / count).sum(-1).float()


def bon_expected(pool: Tensor, values: Tensor, n: int) -> Tensor:
    """Expected `values` (M,) of the best-of-n sample by `pool` reward, from a pool of P >= n samples of π.

    Unbiased (Gao et al. 2022, appendix; Nakano et al. 2021): with the pool sorted by reward ascending, the
    k-th (1-based) is the best of a uniformly random n-subset with probability C(k−1, n−1) / C(P, n); samples
    tied in reward share their levels' probability equally. n=1 gives the pool mean, n=P the value at the max.
    pool, values: (M, P).
    """
    _check_rewards(pool, "bon_expected")
    if values.shape != pool.shape:
        raise ValueError(f"bon_expected: values {tuple(values.shape)} must have the pool's shape {tuple(pool.shape)}.")
    size = pool.shape[1]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= size:
        raise ValueError(f"bon_expected: n must be an int in [1, P={size}] (the pool size per prompt), got {n!r}.")
    order = torch.sort(pool.double(), dim=1, stable=True).indices  # (M, P) ascending
    ranks = torch.arange(1, size + 1, dtype=torch.float64)  # (P,)
    log_w = _log_comb(ranks - 1, n - 1) - _log_comb(torch.tensor(float(size)), n)  # (P,)
    weight_sorted = torch.where(ranks >= n, log_w.exp(), torch.zeros_like(log_w))  # (P,)
    weight = torch.zeros_like(pool, dtype=torch.float64).scatter(1, order, weight_sorted.expand_as(order))  # (M, P)
    # ties: every sample of a level gets the mean weight of the level's ranks
    same = (pool.double()[:, :, None] == pool.double()[:, None, :]).double()  # (M, P, P)
    weight = (same @ weight[:, :, None]).squeeze(-1) / same.sum(-1)  # (M, P)
    return (weight * values.double()).sum(-1).float()


def _log_comb(a: Tensor, b: int) -> Tensor:
    """log C(a, b) for a >= b >= 0 (elementwise over a)."""
    a = a.double().clamp(min=b)
    return torch.lgamma(a + 1) - math.lgamma(b + 1) - torch.lgamma(a - b + 1)
