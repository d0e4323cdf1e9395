"""Masked reductions of per-token quantities (N, T) to scalars.

The three loss-aggregation strategies of RLHF book §6.2 ("Loss aggregation"):
they differ in how much each token of a short or a long completion weighs.
`mask` is 1 on completion tokens and 0 on prompt and padding; masked positions
never contribute, even if they hold NaN or inf.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .registry import Registry

AGGREGATIONS = Registry("loss aggregation mode")


def check_mask(mask: Tensor, like: Tensor, name: str = "mask") -> Tensor:
    """Validate a 0/1 mask with the shape of `like` (N, T) and return it as bool (N, T)."""
    if not isinstance(mask, Tensor) or not isinstance(like, Tensor):
        raise ValueError(f"`{name}` and the tensor it masks must be torch tensors.")
    if like.dim() != 2 or like.shape[0] == 0:
        raise ValueError(
            f"Per-token tensors must have shape (N, T) with N >= 1 sequences, got "
            f"{tuple(like.shape)}. Pass one row per completion (pad to a common length T)."
        )
    if mask.shape != like.shape:
        raise ValueError(
            f"`{name}` has shape {tuple(mask.shape)} but the per-token tensor it masks has "
            f"{tuple(like.shape)}; they must match (1 on completion tokens, 0 elsewhere)."
        )
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            f"`{name}` must contain only 0 and 1 (1 on completion tokens). To weight tokens, "
            "multiply the per-token loss instead of the mask."
        )
    return mask.bool()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """sum(x*m) / sum(m) over all entries; 0 when the mask is empty (never NaN)."""
    m = check_mask(mask, x)
    return x.masked_fill(~m, 0.0).sum() / m.sum().clamp(min=1)


@AGGREGATIONS.register("token_mean", unit="tokens")
def _token_mean(x: Tensor, m: Tensor, max_len: int) -> Tensor:
    """sum_{i,t} l*m / sum_{i,t} m: every token weighs the same (DAPO; RLHF book §6.2 (2))."""
    return x.sum() / m.sum().clamp(min=1)


@AGGREGATIONS.register("seq_mean", unit="rows")
def _seq_mean(x: Tensor, m: Tensor, max_len: int) -> Tensor:
    """mean_i (sum_t l*m / sum_t m): every sequence weighs the same (GRPO; RLHF book §6.2 (1))."""
    return (x.sum(dim=1) / m.sum(dim=1).clamp(min=1)).mean()  # (N,) -> ()


@AGGREGATIONS.register("seq_sum_norm", unit="rows")
def _seq_sum_norm(x: Tensor, m: Tensor, max_len: int) -> Tensor:
    """mean_i (sum_t l*m) / L_max with a constant L_max (Dr. GRPO; RLHF book §6.2 (3))."""
    return x.sum(dim=1).mean() / max_len


def aggregate(per_token: Tensor, mask: Tensor, mode: str = "token_mean", max_len: int | None = None) -> Tensor:
    """Reduce a per-token loss (N, T) to a scalar with a named strategy (RLHF book §6.2).

    - ``token_mean``: sum(l*m) / sum(m) (DAPO).
    - ``seq_mean``: mean_i (sum_t l*m / sum_t m) (GRPO).
    - ``seq_sum_norm``: mean_i (sum_t l*m) / max_len (Dr. GRPO). `max_len` should be
      the same constant for the whole run (the generation length cap); it defaults
      to T = per_token.shape[1], which changes with padding. Other modes ignore it.

    Rows with no masked token contribute 0 (they still count as a row in the
    seq modes); an all-empty mask gives 0, never NaN.
    """
    fn = AGGREGATIONS.get(mode)
    m = check_mask(mask, per_token)
    if max_len is None:
        max_len = per_token.shape[1]
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(
            f"`max_len` must be a positive int (the fixed length normaliser of Dr. GRPO, "
            f"usually the generation cap max_new_tokens), got {max_len!r}."
        )
    x = per_token.masked_fill(~m, 0.0)  # (N, T); padding gets zero value and zero gradient
    return fn(x, m, max_len)


def global_share(mode: str, mask: Tensor, global_tokens: Tensor | float, global_rows: Tensor | float) -> Tensor | float:
    """w_part: the weight of a part's `aggregate` in the aggregate of the whole batch it is part of (all its
    micro-batches on every rank), so that sum_parts w_part * aggregate(part) = aggregate(batch).

    A mode averaging over tokens (``unit="tokens"``): the part's tokens / the batch's; over sequences
    (``unit="rows"``): the part's rows / the batch's trained rows. The global normaliser of verl's ``agg_loss``.
    """
    if AGGREGATIONS.trait(mode, "unit") == "tokens":
        return mask.sum() / global_tokens
    return mask.shape[0] / global_rows
