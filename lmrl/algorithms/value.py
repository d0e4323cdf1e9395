"""PPO value-function loss (RLHF book §6.1 "PPO value loss", §6.2 PPO code)."""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregation import aggregate, check_mask, masked_mean


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: str = "seq_mean",
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss 0.5 * max((v - G)^2, (v_clip - G)^2), v_clip = clamp(v, v_old - clip, v_old + clip).

    RLHF book §6.1 (eps_v = 0.2; masked per-sequence mean then batch mean, hence
    agg="seq_mean"). clip=None gives the plain 0.5 (v - G)^2. Shapes (N, T); only
    `values` carries gradient. v itself is clamped into the band (TRL, verl), so inside
    the band v_clip == v exactly (v_old + clamp(v - v_old, ...) can round one step off
    v and count an unclipped token as clipped). Stats: value/clip_frac (share of tokens
    where the clipped term is the larger one), value/mean, value/returns_mean.
    """
    m = check_mask(mask, values)
    for name, x in (("old_values", old_values), ("returns", returns)):
        if not isinstance(x, Tensor) or x.shape != values.shape:
            raise ValueError(
                f"value_loss: `{name}` must have the shape of `values` {tuple(values.shape)}, got "
                f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}."
            )
    if clip is not None and not clip > 0:
        raise ValueError(f"value_loss: `clip` must be > 0 or None (no clipping), got {clip!r}.")
    v = values.masked_fill(~m, 0.0)  # (N, T)
    old_v = old_values.detach().masked_fill(~m, 0.0)
    target = returns.detach().masked_fill(~m, 0.0)
    err = (v - target) ** 2  # (N, T)
    if clip is None:
        per_token, clip_frac = 0.5 * err, 0.0
    else:
        v_clip = torch.clamp(v, old_v - clip, old_v + clip)  # (N, T)
        err_clip = (v_clip - target) ** 2
        per_token = 0.5 * torch.maximum(err, err_clip)
        clip_frac = float(masked_mean((err_clip > err).float(), m))
    stats = {
        "value/clip_frac": clip_frac,
        "value/mean": float(masked_mean(v.detach(), m)),
        "value/returns_mean": float(masked_mean(target, m)),
    }
    return aggregate(per_token, m, agg, max_len), stats
