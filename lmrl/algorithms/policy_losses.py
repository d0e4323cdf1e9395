"""Policy-gradient losses: per-token surrogates registered by name, plus the shared parts.

Every entry of `POLICY_LOSSES` has the signature
``(logp, old_logp, advantages, mask, *, <its options>) -> (per_token_loss (N, T), stats)``
and receives sanitised inputs: advantages already broadcast to (N, T), everything
but `logp` detached, and 0 at masked-out positions. `policy_loss` adds what all
entries share exactly once: the train–inference importance weights and masks
(`lmrl.algorithms.mismatch`: TIS/MIS at token, sequence or geometric level), the
KL-in-loss term, the entropy bonus, a token selection (`train_tokens`), aggregation
and the common stats. Sources: RLHF book ch. 6 (§6.1, §6.2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregation import aggregate, check_mask, masked_mean
from .kl import KL_ESTIMATORS, kl
from .mismatch import check_is_options, importance_weights, offpolicy_mask
from .registry import Registry, check_options, keyword_options

POLICY_LOSSES = Registry("policy loss")

LOG_RATIO_CLAMP = 20.0  # |logp - old_logp| cap before exp: keeps ratios and their gradients finite

SHARED_OPTIONS = (
    "agg",
    "max_len",
    "kl_coef",
    "ref_logp",
    "kl_estimator",
    "tis_cap",
    "is_level",
    "is_mode",
    "is_low",
    "offpolicy_mask_threshold",
    "offpolicy_mask_rows",
    "sampler_logp",
    "entropy",
    "entropy_coef",
    "train_tokens",
)


def _check_clip(name: str, clip_low: float, clip_high: float) -> None:
    if not (clip_low >= 0 and clip_high >= 0):
        raise ValueError(
            f"{name}: clip_low and clip_high are distances from 1 and must be >= 0 (the band is "
            f"[1 - clip_low, 1 + clip_high]), got clip_low={clip_low}, clip_high={clip_high}."
        )


def _masked_max(x: Tensor, m: Tensor) -> float:
    return float(x.masked_fill(~m, float("-inf")).max()) if bool(m.any()) else 0.0


@POLICY_LOSSES.register("pg", scales_by_advantage=True)
def _pg(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, dict]:
    """l_t = -A_t * exp(logp_t - sg(logp_t)): value -A_t, gradient -A_t grad logp_t.

    Vanilla policy gradient / REINFORCE (Williams 1992; RLHF book §6.1 and §6.2 "one
    gradient step per batch"). No ratio to pi_old, no clipping.
    """
    per_token = -advantages * torch.exp(logp - logp.detach())  # (N, T)
    return per_token, {"policy/clip_frac": 0.0}


@POLICY_LOSSES.register("ppo", scales_by_advantage=True)
def _ppo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float | None = None,
    clip_delta: float | None = None,
) -> tuple[Tensor, dict]:
    """l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - clip_low, 1 + clip_high)), rho_t = exp(logp - old_logp).

    PPO clipped surrogate (Schulman et al. 2017; RLHF book §6.1), also GRPO's loss
    (Shao et al. 2024). Defaults eps = 0.2 both sides; DAPO's clip-higher uses
    clip_high = 0.28 (Yu et al. 2025). clip_frac = share of tokens where the clipped
    branch is strictly larger (the gradient is 0 there).

    Bounds on the ratio of tokens with A_t < 0, whose PPO loss grows without bound in rho_t:
    - ``clip_ratio_c`` = c > 1, dual-clip PPO (Ye et al. 2020, arXiv 1912.09729; verl ``clip_ratio_c``):
      l_t = min(l_t, -A_t c) where A_t < 0 (the gradient is 0 once rho_t > c). clip_frac_lower = share of
      tokens where that bound is active (verl ``pg_clipfrac_lower``).
    - ``clip_delta`` = delta > 1 + clip_high, INTELLECT-2's two-sided clip (Prime Intellect 2025, arXiv
      2505.07291 §3.2; TRL ``delta``): the unclipped branch uses min(rho_t, delta),
      l_t = max(-A_t min(rho_t, delta), -A_t clip(rho_t, ...)); on A_t < 0 tokens this equals dual-clip with
      c = delta, and A_t > 0 tokens are unchanged (their clipped branch is already below delta).
    """
    _check_clip("ppo", clip_low, clip_high)
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"ppo: dual-clip `clip_ratio_c` must be > 1 (verl uses 3.0), got {clip_ratio_c!r}.")
    if clip_delta is not None and not clip_delta > 1 + clip_high:
        raise ValueError(
            f"ppo: `clip_delta` must be > 1 + clip_high = {1 + clip_high} (INTELLECT-2 uses 4), got "
            f"{clip_delta!r}; a smaller bound would also cut tokens with positive advantages."
        )
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # (N, T)
    bounded = ratio.clamp(max=clip_delta) if clip_delta is not None else ratio
    unclipped = -advantages * bounded
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    stats = {"policy/clip_frac": float(masked_mean((clipped > unclipped).float(), mask))}
    per_token = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        bound = -advantages * clip_ratio_c  # (N, T)
        lower = (advantages < 0) & (per_token > bound)
        per_token = torch.where(advantages < 0, torch.minimum(per_token, bound), per_token)
        stats["policy/clip_frac_lower"] = float(masked_mean(lower.float(), mask))
    return per_token, stats


@POLICY_LOSSES.register("gspo", scales_by_advantage=True)
def _gspo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[Tensor, dict]:
    """PPO clip on the sequence ratio s_i = exp(mean_{t in a_i} (logp - old_logp)) (GSPO,
    Zheng et al. 2025, arXiv 2507.18071; RLHF book §6.1).

    GSPO-token form: s_{i,t} = sg(s_i) * exp(logp_t - sg(logp_t)) has value s_i and
    gradient s_i grad logp_t; l_t = max(-A_i s_{i,t}, -A_i clip(s_{i,t}, 1 - clip_low,
    1 + clip_high)). With agg="seq_mean" its gradient equals that of the sequence
    objective -A_i min(s_i, clip(s_i)). Defaults 3e-4 / 4e-4 are the paper's (§5.1).
    Advantages must be per sequence (constant over each row's tokens).
    """
    _check_clip("gspo", clip_low, clip_high)
    big = torch.finfo(advantages.dtype).max
    a_max = advantages.masked_fill(~mask, -big).amax(dim=1)  # (N,)
    a_min = advantages.masked_fill(~mask, big).amin(dim=1)  # (N,)
    spread = torch.where(mask.any(dim=1), a_max - a_min, 0.0)
    if bool((spread > 1e-6 * (1.0 + a_max.abs())).any()):
        raise ValueError(
            "gspo needs one advantage per sequence (its ratio is per sequence), but some rows "
            "of `advantages` vary over their completion tokens. Pass advantages of shape (N,), "
            "or use 'ppo' for per-token advantages."
        )
    n_tok = mask.sum(dim=1).clamp(min=1)  # (N,)
    seq_log_ratio = (logp.detach() - old_logp).sum(dim=1) / n_tok  # (N,), masked positions are 0
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    s_tok = torch.exp(seq_log_ratio[:, None] + logp - logp.detach())  # (N, T), value s_i
    unclipped = -advantages * s_tok
    clipped = -advantages * s_tok.clamp(1.0 - clip_low, 1.0 + clip_high)
    has_tok = mask.any(dim=1)
    seq_ratio = torch.exp(seq_log_ratio)
    stats = {
        "policy/clip_frac": float(masked_mean((clipped > unclipped).float(), mask)),
        "policy/seq_ratio_mean": float(seq_ratio[has_tok].mean()) if bool(has_tok.any()) else 0.0,
        "policy/seq_ratio_max": float(seq_ratio[has_tok].max()) if bool(has_tok.any()) else 0.0,
    }
    return torch.maximum(unclipped, clipped), stats


@POLICY_LOSSES.register("cispo", scales_by_advantage=True)
def _cispo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
) -> tuple[Tensor, dict]:
    """l_t = -sg(clip(rho_t, 1 - clip_low, 1 + clip_high)) * A_t * logp_t (CISPO, MiniMax-M1,
    arXiv 2506.13585; RLHF book §6.1).

    Clips the importance weight, not the objective, so every token keeps a gradient.
    MiniMax-M1 sets no lower bound (clip_low large; default 1.0 gives bound 0) and
    tunes only clip_high; 0.28 is our default (DAPO's clip-higher value). clip_frac =
    share of tokens whose weight was clipped.
    """
    _check_clip("cispo", clip_low, clip_high)
    ratio = torch.exp((logp.detach() - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (N, T), detached
    clip_frac = masked_mean((weight != ratio).float(), mask)
    return -weight * advantages * logp, {"policy/clip_frac": float(clip_frac)}


def _broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    n, t_len = like.shape
    if advantages.shape == (n,):
        return advantages[:, None].expand(n, t_len)  # (N,) -> (N, T)
    if advantages.shape == (n, t_len):
        return advantages
    raise ValueError(
        f"`advantages` must be (N,) = ({n},) per sequence or (N, T) = ({n}, {t_len}) per token, "
        f"got {tuple(advantages.shape)}."
    )


def _constant(x: Tensor | None, like: Tensor, m: Tensor, name: str) -> Tensor | None:
    """Detach `x`, check its shape and finiteness on the mask, zero it off the mask."""
    if x is None:
        return None
    if not isinstance(x, Tensor) or x.shape != like.shape:
        raise ValueError(
            f"`{name}` must be a tensor of shape {tuple(like.shape)} like `logp`, got "
            f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}."
        )
    x = x.detach().masked_fill(~m, 0.0)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"`{name}` is NaN or inf on completion tokens (mask == 1).")
    return x


def policy_loss(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token_mean",
    max_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp: Tensor | None = None,
    kl_estimator: str = "k3",
    tis_cap: float | None = None,
    is_level: str = "token",
    is_mode: str = "truncate",
    is_low: float | None = None,
    offpolicy_mask_threshold: float | None = None,
    offpolicy_mask_rows: str = "all",
    sampler_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    train_tokens: Tensor | None = None,
    **opts,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar policy loss and float stats for the surrogate `name` in `POLICY_LOSSES`.

    Shapes: logp, old_logp, mask, ref_logp, sampler_logp (N, T); advantages (N,) or (N, T).
    Only `logp` carries gradient; the others are treated as constants (detached).
    Per token: l = entry(...) * k * w * o + kl_coef * kl(logp, ref_logp) - entropy_coef * H, where w is
    the train–inference importance weight pi_old/pi_sampler of `lmrl.algorithms.mismatch.importance_weights` at
    `is_level` (token, sequence, geometric) in `is_mode` (truncate: min(w, tis_cap), the default token TIS of RLHF
    book §6.2 and Yao et al. 2025; mask: w zeroed outside [is_low or 1/tis_cap, tis_cap]; off: 1, only logged),
    o the off-policy sequence mask (`offpolicy_mask_threshold`, `offpolicy_mask_rows`; DeepSeek-V3.2),
    k = `train_tokens` (bool (N, T), e.g. `high_entropy_tokens`; default all) and
    H = `entropy` (N, T), the policy's per-token entropy WITH gradient (the entropy bonus, Williams &
    Peng 1991; Schulman et al. 2017 eq. 9, verl ``entropy_coeff``); then `aggregate(l, mask, agg,
    max_len)`: tokens outside `train_tokens` add 0 to the surrogate but still count in the normaliser
    (TRL ``top_entropy_quantile``), and the bonus is aggregated like the policy loss.
    Entry options (e.g. clip_low, clip_high) go in `opts`; unknown options raise.
    Stats (floats, masked token means; named as logged, docs/metrics.md): policy/clip_frac, policy/approx_kl =
    mean 0.5 (logp - old_logp)^2, policy/ratio_mean and policy/ratio_max of the per-token ratio (gspo adds
    policy/seq_ratio_*), and when given: kl (the `kl_estimator` value, logged whenever ref_logp is passed),
    policy/tis_weight_mean, _weight_max, _clip_frac, _masked_frac, policy/offpolicy_masked_frac,
    policy/sampler_logp_gap = mean |old_logp - sampler_logp|, loss/entropy = -entropy_coef * aggregate(H) (part of
    the loss) and policy/entropy_trained_frac = share of tokens in train_tokens.
    """
    fn = POLICY_LOSSES.get(name)
    check_options(f"policy loss '{name}'", opts, SHARED_OPTIONS + keyword_options(fn))
    KL_ESTIMATORS.get(kl_estimator)  # fail fast on a typo even when the KL term is off
    if not isinstance(logp, Tensor):
        raise ValueError("`logp` must be a tensor (N, T) of log-probs of the sampled tokens.")
    m = check_mask(mask, logp)
    if not kl_coef >= 0:
        raise ValueError(f"`kl_coef` must be >= 0, got {kl_coef!r}.")
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 puts a KL to the reference model in the loss: pass `ref_logp`.")
    if (tis_cap is not None or offpolicy_mask_threshold is not None) and sampler_logp is None:
        raise ValueError(
            "tis_cap (and offpolicy_mask_threshold) turn on the importance weight pi_learner/pi_sampler: pass "
            "`sampler_logp` (the rollout engine's log-probs)."
        )
    if tis_cap is not None:
        check_is_options(is_level, is_mode, tis_cap, is_low)
    if not entropy_coef >= 0 or (entropy_coef > 0 and entropy is None):
        raise ValueError(
            f"`entropy_coef` must be >= 0 and, when > 0, comes with `entropy` (N, T) (the policy's "
            f"per-token entropy, with gradient), got entropy_coef={entropy_coef!r}."
        )

    logp = logp.masked_fill(~m, 0.0)  # (N, T); padding logp may be -inf: keep grads finite
    if not bool(torch.isfinite(logp.detach()).all()):
        raise ValueError("`logp` is NaN or inf on completion tokens (mask == 1).")
    old_logp = _constant(old_logp, logp, m, "old_logp")
    if not isinstance(advantages, Tensor):
        raise ValueError("`advantages` must be a tensor of shape (N,) or (N, T).")
    adv = _constant(_broadcast_advantages(advantages, logp), logp, m, "advantages")
    ref_logp = _constant(ref_logp, logp, m, "ref_logp")
    sampler_logp = _constant(sampler_logp, logp, m, "sampler_logp")

    per_token, stats = fn(logp, old_logp, adv, m, **opts)  # (N, T)
    if train_tokens is not None:
        keep = check_mask(train_tokens, logp, "train_tokens") & m  # (N, T)
        per_token = per_token * keep
        stats["policy/entropy_trained_frac"] = float(masked_mean(keep.float(), m))

    log_ratio = logp.detach() - old_logp  # (N, T)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    stats["policy/approx_kl"] = float(masked_mean(0.5 * log_ratio**2, m))
    stats["policy/ratio_mean"] = float(masked_mean(ratio, m))
    stats["policy/ratio_max"] = _masked_max(ratio, m)

    if sampler_logp is not None:
        gap = old_logp - sampler_logp  # (N, T)
        stats["policy/sampler_logp_gap"] = float(masked_mean(gap.abs(), m))
        if tis_cap is not None:
            weight, is_stats = importance_weights(gap, m, level=is_level, mode=is_mode, high=tis_cap, low=is_low)
            per_token = per_token * weight  # (N, T), detached
            stats.update({f"policy/tis_{key}": value for key, value in is_stats.items()})
        if offpolicy_mask_threshold is not None:
            keep = offpolicy_mask(gap, m, offpolicy_mask_threshold, adv, offpolicy_mask_rows)  # (N, T)
            per_token = per_token * keep
            stats["policy/offpolicy_masked_frac"] = float(masked_mean((~keep).float(), m))

    if ref_logp is not None:
        kl_tok = kl(logp, ref_logp, kl_estimator)  # (N, T)
        stats["kl"] = float(masked_mean(kl_tok.detach(), m))
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl_tok

    if entropy_coef > 0:
        if not isinstance(entropy, Tensor) or entropy.shape != logp.shape:
            raise ValueError(f"`entropy` must be a tensor {tuple(logp.shape)} like `logp`.")
        bonus = entropy_coef * entropy.masked_fill(~m, 0.0)  # (N, T), keeps its gradient
        per_token = per_token - bonus
        stats["loss/entropy"] = -float(aggregate(bonus.detach(), m, agg, max_len))

    return aggregate(per_token, m, agg, max_len), stats
