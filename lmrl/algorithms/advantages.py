"""Advantage estimators: outcome rewards (N,) -> advantages (N,), and per-token GAE.

Layout: B prompts x G samples, prompt-major, so the rewards of prompt i are
``rewards.view(-1, G)[i]`` (N = B*G). Sources: RLHF book ch. 6 (§6.1 REINFORCE,
RLOO, GRPO, Dr. GRPO; §6.2 implementation; §6.3 GAE) and the papers named in
each docstring.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .aggregation import check_mask
from .registry import Registry, check_options, keyword_options

ADVANTAGES = Registry("advantage estimator")


def _check_rewards(rewards: Tensor, group_size: int) -> Tensor:
    """Validate outcome rewards (N,) for groups of `group_size`; return them as float."""
    if not isinstance(rewards, Tensor) or rewards.dim() != 1 or rewards.numel() == 0:
        shape = tuple(rewards.shape) if isinstance(rewards, Tensor) else type(rewards).__name__
        raise ValueError(
            f"`rewards` must be a non-empty 1-D tensor (N,) of one scalar reward per completion, "
            f"got {shape}. Flatten B prompts x G samples prompt-major: rewards.view(-1, G)[i] "
            "are the rewards of prompt i."
        )
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"`group_size` (samples per prompt) must be an int >= 1, got {group_size!r}.")
    if rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of group_size={group_size}: "
            "N must be B prompts x G samples. Check the samples per prompt or drop incomplete groups."
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError(
            "`rewards` contains NaN or inf. Fix the reward function (or map failures to a finite "
            "penalty) before computing advantages."
        )
    return rewards


def group_stats(rewards: Tensor, group_size: int) -> dict[str, Tensor]:
    """Per-group reward mean (B,), std (B,; unbiased, 0 when G == 1) and zero-variance mask (B,)."""
    rewards = _check_rewards(rewards, group_size)
    groups = rewards.view(-1, group_size)  # (B, G)
    std = groups.std(dim=1) if group_size > 1 else torch.zeros_like(groups[:, 0])
    return {
        "mean": groups.mean(dim=1),
        "std": std,
        "zero_variance": zero_variance_groups(rewards, group_size),
    }


def zero_variance_groups(rewards: Tensor, group_size: int) -> Tensor:
    """Bool (B,): True for groups whose G rewards are all equal (no learning signal).

    DAPO dynamic sampling drops these groups (all correct or all wrong); RLHF book §6.3, §7.2.3.
    """
    groups = _check_rewards(rewards, group_size).view(-1, group_size)  # (B, G)
    return groups.amax(dim=1) == groups.amin(dim=1)


@ADVANTAGES.register("reinforce")
def _reinforce(rewards: Tensor, group_size: int) -> Tensor:
    """A_i = r_i - mean_j r_j: REINFORCE with the batch-mean baseline (Williams 1992; RLHF book §6.1).

    The baseline is the mean over the whole batch; groups are ignored.
    """
    return rewards - rewards.mean()


@ADVANTAGES.register("reinforce_pp")
def _reinforce_pp(rewards: Tensor, group_size: int, *, eps: float = 1e-8) -> Tensor:
    """A_i = (r_i - mean_j r_j) / (std_j r_j + eps): REINFORCE++ (Hu 2025, arXiv 2501.03262, eq. 7 "global batch
    advantage normalization"; OpenRLHF ``reinforce_plus_plus``, verl ``reinforce_plus_plus``).

    No per-prompt baseline: the mean and std (unbiased) are over the whole batch (every rank's rewards), so it works
    with one sample per prompt. Here on outcome rewards, one advantage per completion; the paper normalises
    token-level returns that include a k1 KL penalty (use ``kl_coef`` for a KL in the loss instead).
    """
    if rewards.numel() < 2:
        raise ValueError(
            "The 'reinforce_pp' advantage normalises by the std of the batch's rewards: it needs at "
            f"least 2 rewards, got {rewards.numel()}. Sample more prompts per step."
        )
    if not eps > 0:
        raise ValueError(f"reinforce_pp `eps` must be > 0 (it keeps the division finite), got {eps!r}.")
    return (rewards - rewards.mean()) / (rewards.std() + eps)


@ADVANTAGES.register("rloo")
def _rloo(rewards: Tensor, group_size: int) -> Tensor:
    """A_k = R_k - 1/(K-1) sum_{i != k} R_i = K/(K-1) (R_k - mean R) (RLOO, Ahmadian et al. 2024;
    RLHF book §6.1). Needs K = group_size >= 2."""
    if group_size < 2:
        raise ValueError(
            "The 'rloo' advantage needs group_size >= 2: its baseline for a sample is the mean "
            "reward of the OTHER samples of the same prompt, and with one sample per prompt there "
            "are none. Sample at least 2 completions per prompt, or use 'reinforce'."
        )
    groups = rewards.view(-1, group_size)  # (B, K)
    baseline = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)  # (B, K)
    return (groups - baseline).reshape(-1)


@ADVANTAGES.register("grpo")
def _grpo(rewards: Tensor, group_size: int, *, eps: float = 1e-4, scale: str = "group") -> Tensor:
    """A_i = (r_i - mean_group r) / (std + eps) (GRPO, Shao et al. 2024 DeepSeekMath; RLHF book §6.2).

    std is torch.std (unbiased). `scale`: "group" divides by the std of the
    prompt's group (book); "batch" by the std of all rewards in the batch (as TRL
    ``scale_rewards="batch"``; RLHF book §7.2.3 item 9); "none" does not divide,
    which is Dr. GRPO (Liu et al. 2025).
    """
    if not eps >= 0:
        raise ValueError(f"grpo `eps` must be >= 0 (it keeps the division finite), got {eps!r}.")
    centred = rewards.view(-1, group_size) - rewards.view(-1, group_size).mean(1, keepdim=True)
    centred = centred.reshape(-1)  # (N,)
    if scale == "none":
        return centred
    if scale == "group":
        if group_size < 2:
            raise ValueError(
                "grpo with scale='group' needs group_size >= 2: the std of a single sample is "
                "undefined. Sample more completions per prompt, or use scale='batch' or 'none'."
            )
        std = rewards.view(-1, group_size).std(dim=1).repeat_interleave(group_size)  # (N,)
        return centred / (std + eps)
    if scale == "batch":
        if rewards.numel() < 2:
            raise ValueError("grpo with scale='batch' needs at least 2 rewards to compute a std.")
        return centred / (rewards.std() + eps)
    raise ValueError(f"grpo `scale` must be 'group', 'batch' or 'none', got {scale!r}.")


@ADVANTAGES.register("dr_grpo")
def _dr_grpo(rewards: Tensor, group_size: int) -> Tensor:
    """A_i = r_i - mean_group r: GRPO without the std division (Dr. GRPO, Liu et al. 2025;
    RLHF book §6.1). G/(G-1) * A_i equals the RLOO advantage."""
    groups = rewards.view(-1, group_size)  # (B, G)
    return (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)


def advantages(name: str, rewards: Tensor, group_size: int, **opts) -> Tensor:
    """Outcome advantages (N,) from rewards (N,) with the estimator `name` in `ADVANTAGES`.

    Names: reinforce, reinforce_pp (opt `eps`), rloo, grpo (opts `eps`, `scale`), dr_grpo. Unknown options raise;
    so does an estimator with the ``value_model`` trait (``gae``: per token, on a value model's values).
    """
    fn = ADVANTAGES.get(name)
    if ADVANTAGES.trait(name, "value_model", False):
        raise ValueError(
            f"advantage estimator '{name}' works per token on a value model's values, not on outcome rewards: "
            f"call {fn.__name__}(rewards, values, mask) (lmrl.trainers.rl.targets does, for algorithm=ppo)."
        )
    check_options(f"advantage estimator '{name}'", opts, keyword_options(fn))
    return fn(_check_rewards(rewards, group_size), group_size, **opts)


@ADVANTAGES.register("gae", value_model=True)
@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation per token (Schulman et al. 2015; RLHF book §6.3).

    delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, returns = A + V.
    Only masked tokens are steps: t+1 is the next masked token of the row (masked-out
    tool/prompt tokens in between are skipped) and the last masked token is terminal
    (V = 0 after it). Rewards and values at masked-out positions are ignored; the
    advantages and returns there are 0. Both outputs are detached (they are targets).
    Shapes: rewards, values, mask (N, T) -> advantages (N, T), returns (N, T).
    """
    m = check_mask(mask, rewards)
    if values.shape != rewards.shape:
        raise ValueError(
            f"gae: `values` has shape {tuple(values.shape)} but `rewards` has "
            f"{tuple(rewards.shape)}; both are per token (N, T)."
        )
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae: gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}.")
    r = rewards.float().masked_fill(~m, 0.0)  # (N, T)
    v = values.float().masked_fill(~m, 0.0)  # (N, T)
    if not (bool(torch.isfinite(r).all()) and bool(torch.isfinite(v).all())):
        raise ValueError("gae: rewards or values are NaN/inf on masked (completion) tokens.")
    n, t_len = r.shape
    adv = torch.zeros_like(r)  # (N, T)
    next_v = r.new_zeros(n)  # (N,) value of the next real token; 0 after the last one
    running = r.new_zeros(n)  # (N,) A of the next real token
    for t in reversed(range(t_len)):
        real = m[:, t]  # (N,)
        delta = r[:, t] + gamma * next_v - v[:, t]
        running = torch.where(real, delta + gamma * lam * running, running)
        next_v = torch.where(real, v[:, t], next_v)
        adv[:, t] = torch.where(real, running, 0.0)
    return adv, (adv + v).masked_fill(~m, 0.0)


def whiten(
    x: Tensor,
    mask: Tensor | None = None,
    shift_mean: bool = True,
    eps: float = 1e-8,
    all_sum: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """(x - mean) / (std + eps) over the masked entries (RLHF book §6.2 PPO code, with the
    erratum of §8 applied: padding is excluded from mean and std). std is unbiased.

    shift_mean=False adds the mean back (rescale only). Masked-out entries are 0.
    ``all_sum``: a batch split over processes is whitened as one; the count, sum and sum of
    squared deviations are summed over every part with it (e.g. `lmrl.parallel.runtime.all_sum`).
    """
    total = all_sum or (lambda t: t)
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else check_mask(mask, x)
    count = total(m.sum())
    if int(count) < 2:
        raise ValueError(
            f"whiten needs at least 2 masked entries to estimate a std, got {int(count)}. "
            "Whiten over a larger batch, or skip whitening for this batch."
        )
    xm = x.masked_fill(~m, 0.0)
    mean = total(xm.sum()) / count
    var = total(((x - mean).masked_fill(~m, 0.0) ** 2).sum()) / (count - 1)
    out = (x - mean) / (var.sqrt() + eps)
    if not shift_mean:
        out = out + mean
    return out.masked_fill(~m, 0.0)
