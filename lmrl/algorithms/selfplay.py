"""Advantages of Language Self-Play's two roles (Kuba et al. 2025, arXiv 2509.07414, §2, Algorithm 1).

One model plays Challenger (writes N queries q_i) and Solver (answers each G times, a_i^j).
Rewards are prompt-major over the *answered* queries: ``rewards.view(-1, G)[k]`` are the G
rewards of the k-th answered query. With the task reward r_ij = R(q_i, a_i^j) and the
optional quality self-reward rq_ij = R_Q(q_i, a_i^j) (LSP; absent = 0 for LSP-Zero):

    V(q_i)   = 1/G sum_j r_ij                       (eq. 2)      V_Q(q_i) = 1/G sum_j rq_ij
    Solver:      s_ij = r_ij + rq_ij,  A_Sol_ij = s_ij - b_i,  b_i = mean_j s_ij ("total") or V(q_i) ("task")
    Challenger:  c_i = -V(q_i) + V_Q(q_i),  A_Ch_i = c_i - 1/N sum_k c_k   (eq. 3 for LSP-Zero: V - V(q_i))

Open points of the paper, as options: the Solver baseline with or without the self-reward
(``baseline``; default "total", the spec's reading), and std scaling (``scale``; default "none",
the paper mentions none). A query the environment rejects (malformed) is not answered; its
Challenger reward is the constant ``malformed_reward`` and it takes part in the batch baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

SOLVER_BASELINES = ("total", "task")
SCALES = ("none", "std")


@dataclass(frozen=True)
class SelfPlayAdvantages:
    """Both roles' advantages for one self-play batch (M answered queries out of N, G answers each)."""

    solver: Tensor  # (M*G,) A_Sol, prompt-major over the answered queries
    challenger: Tensor  # (N,) A_Ch, one per written query (malformed ones included)
    challenger_rewards: Tensor  # (N,) c_i = -V(q_i) + V_Q(q_i), or malformed_reward
    query_values: Tensor  # (M,) V(q_i) of the answered queries


def _check(rewards: Tensor, group_size: int, name: str = "rewards") -> Tensor:
    if not isinstance(rewards, Tensor) or rewards.dim() != 1:
        shape = tuple(rewards.shape) if isinstance(rewards, Tensor) else type(rewards).__name__
        raise ValueError(
            f"`{name}` must be a 1-D tensor (M*G,) of one scalar per Solver answer, prompt-major over the "
            f"answered queries, got {shape}. Flatten it so that {name}.view(-1, G)[k] are query k's answers."
        )
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"`group_size` (Solver answers per query, G) must be an int >= 1, got {group_size!r}.")
    if rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} {name} cannot be split into groups of G={group_size}: every answered query "
            "needs exactly G answers. Check answers_per_query."
        )
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError(f"`{name}` contains NaN or inf; map reward failures to a finite value first.")
    return rewards


def _check_scale(scale: str, eps: float) -> None:
    if scale not in SCALES:
        raise ValueError(f"`scale` must be one of {SCALES} ('none': the paper; 'std': GRPO-style), got {scale!r}.")
    if not eps >= 0:
        raise ValueError(f"`eps` must be >= 0 (it keeps the std division finite), got {eps!r}.")


def _self_rewards(self_rewards: Tensor | None, rewards: Tensor, group_size: int) -> Tensor:
    if self_rewards is None:
        return torch.zeros_like(rewards)
    self_rewards = _check(self_rewards, group_size, "self_rewards")
    if self_rewards.shape != rewards.shape:
        raise ValueError(
            f"`self_rewards` has shape {tuple(self_rewards.shape)} but `rewards` {tuple(rewards.shape)}; "
            "give one self-reward per Solver answer (or None for LSP-Zero)."
        )
    return self_rewards.to(rewards.dtype)


def query_values(rewards: Tensor, group_size: int) -> Tensor:
    """V(q_i) = 1/G sum_j r_ij (LSP eq. 2): the Solver's mean reward on each query. (M*G,) -> (M,)."""
    rewards = _check(rewards, group_size)
    return rewards.view(-1, group_size).mean(dim=1)


def solver_advantages(
    rewards: Tensor,
    group_size: int,
    self_rewards: Tensor | None = None,
    *,
    baseline: str = "total",
    scale: str = "none",
    eps: float = 1e-4,
) -> Tensor:
    """A_Sol_ij = s_ij - b_i with s_ij = r_ij + rq_ij (LSP §2, Algorithm 1). (M*G,) -> (M*G,).

    b_i = mean_j s_ij (``baseline="total"``: the self-reward is in the baseline) or V(q_i) =
    mean_j r_ij (``"task"``). ``scale="std"`` divides by the unbiased std of s over the query's
    G answers plus ``eps`` (GRPO, Shao et al. 2024); the paper does not scale.
    """
    if baseline not in SOLVER_BASELINES:
        raise ValueError(f"`baseline` must be one of {SOLVER_BASELINES}, got {baseline!r}.")
    _check_scale(scale, eps)
    rewards = _check(rewards, group_size)
    total = rewards + _self_rewards(self_rewards, rewards, group_size)  # (M*G,)
    groups = total.view(-1, group_size)  # (M, G)
    base = (
        groups.mean(dim=1, keepdim=True) if baseline == "total" else rewards.view(-1, group_size).mean(1, keepdim=True)
    )
    adv = groups - base  # (M, G)
    if scale == "std":
        if group_size < 2:
            raise ValueError("scale='std' needs G >= 2 answers per query: the std of one answer is undefined.")
        adv = adv / (groups.std(dim=1, keepdim=True) + eps)
    return adv.reshape(-1)


def challenger_rewards(rewards: Tensor, group_size: int, self_rewards: Tensor | None = None) -> Tensor:
    """c_i = -V(q_i) + V_Q(q_i) (LSP §2; LSP-Zero: -V(q_i)). (M*G,) -> (M,)."""
    rewards = _check(rewards, group_size)
    quality = _self_rewards(self_rewards, rewards, group_size)
    return -rewards.view(-1, group_size).mean(dim=1) + quality.view(-1, group_size).mean(dim=1)


def challenger_advantages(rewards: Tensor, *, scale: str = "none", eps: float = 1e-4) -> Tensor:
    """A_Ch_i = c_i - 1/N sum_k c_k: the batch-mean baseline over the N queries (LSP eq. 3). (N,) -> (N,).

    ``scale="std"`` divides by the unbiased std of c over the batch plus ``eps``.
    """
    _check_scale(scale, eps)
    if not isinstance(rewards, Tensor) or rewards.dim() != 1 or rewards.numel() == 0:
        raise ValueError("challenger_advantages needs a non-empty 1-D tensor (N,) of Challenger rewards c_i.")
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError(
            "Challenger rewards contain NaN or inf; map failures (e.g. malformed_reward) to a finite value."
        )
    adv = rewards - rewards.mean()
    if scale == "std":
        if rewards.numel() < 2:
            raise ValueError("scale='std' needs N >= 2 queries: the std of one Challenger reward is undefined.")
        adv = adv / (rewards.std() + eps)
    return adv


def selfplay_advantages(
    rewards: Tensor,
    group_size: int,
    self_rewards: Tensor | None = None,
    valid: Tensor | None = None,
    *,
    malformed_reward: float = -1.0,
    baseline: str = "total",
    scale: str = "none",
    eps: float = 1e-4,
) -> SelfPlayAdvantages:
    """Both roles' advantages for N written queries of which the ``valid`` ones (bool (N,)) were answered.

    ``rewards`` / ``self_rewards`` are (M*G,) over the M = valid.sum() answered queries, in the order
    of the queries. A malformed query gets c_i = ``malformed_reward``; the Challenger baseline is the
    mean of c over all N queries. ``valid=None`` means every query was answered.
    """
    rewards = _check(rewards, group_size)
    if valid is None:
        valid = torch.ones(rewards.numel() // group_size, dtype=torch.bool)
    if not isinstance(valid, Tensor) or valid.dtype != torch.bool or valid.dim() != 1 or valid.numel() == 0:
        raise ValueError("`valid` must be a non-empty bool tensor (N,): True for each query the Solver answered.")
    m = int(valid.sum())
    if rewards.numel() != m * group_size:
        raise ValueError(
            f"`rewards` has {rewards.numel()} entries but {m} valid queries x G={group_size} answers = "
            f"{m * group_size}; give rewards for the valid queries only."
        )
    solver = solver_advantages(rewards, group_size, self_rewards, baseline=baseline, scale=scale, eps=eps)  # (M*G,)
    c = torch.full((valid.numel(),), float(malformed_reward), dtype=rewards.dtype)  # (N,)
    c[valid] = challenger_rewards(rewards, group_size, self_rewards)  # (M,) into the answered slots
    return SelfPlayAdvantages(
        solver, challenger_advantages(c, scale=scale, eps=eps), c, query_values(rewards, group_size)
    )
