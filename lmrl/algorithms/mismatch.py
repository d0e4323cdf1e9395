"""Train–inference mismatch correction: importance weights pi_old/pi_sampler and off-policy masks.

The rollout engine samples from pi_sampler (another numeric path than the learner's, e.g. vLLM or bf16, or older
weights when rollouts run ahead: ``async_steps``); the learner's surrogate is built on pi_old, its own recomputed
log-probs. Per completion token t of row i, with the log-ratio d_{i,t} = log pi_old - log pi_sampler (0 off the
mask) and n_i = the row's completion tokens:

- level ``token``:     log w_{i,t} = clamp(d_{i,t}, -10, 10)
- level ``sequence``:  log w_i = clamp(sum_t d_{i,t}, -20, 20), the product of the row's token ratios
- level ``geometric``: log w_i = clamp(sum_t d_{i,t} / n_i, -10, 10), their geometric mean

(a row-level weight is broadcast to the row's tokens), then per mode, with ``high`` > 0 and ``low`` in [0, high]:

- ``truncate`` (TIS): w' = min(w, high), the weight whose bias is bounded (Ionides 2008; Yao et al. 2025, "Your
  efficient RL framework secretly brings you off-policy RL training"; RLHF book §6.2);
- ``mask`` (MIS, "icepop"): w' = w * 1[low <= w <= high] (default low = 1/high): tokens (level token) or whole rows
  (sequence, geometric) whose weight leaves the band get weight 0 (Liu, Li et al. 2025, "When speed kills
  stability"; verl ``rollout_rs``, TRL ``vllm_importance_sampling_mode=token_mask|sequence_mask``, prime-rl's
  masked ratios);
- ``off``: w' = 1, the weights only measured (verl's metrics-only mode); for ablations.

The sequence weight is the exact ratio of the two sequence probabilities (unbiased, variance growing with length);
the geometric mean is length-normalised (its mask in a tight band such as [0.99, 1.01] is SkyRL's first advice).

Off-policy sequence mask (DeepSeek-V3.2 technical report 2025, "off-policy sequence masking"; TRL
``off_policy_mask_threshold``): with
m_i = sum_t d_{i,t} / n_i, rows with |m_i| > delta get weight 0 (``rows="all"``); ``rows="negative"`` is
DeepSeek-V3.2's own rule: only tokens with a negative advantage in rows where the sampler found the row more
likely than the learner, m_i < -delta.

A weight 0 removes a token from the surrogate; it still counts in the loss normaliser (as in TRL; verl also removes
it from the denominator), so a micro-batch's share of the minibatch does not depend on the mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregation import masked_mean

IS_LEVELS = ("token", "sequence", "geometric")
IS_MODES = ("truncate", "mask", "off")
OFFPOLICY_ROWS = ("all", "negative")
TOKEN_LOG_CLAMP = 10.0  # |log w| bound for token and geometric weights (RLHF book §6.2 TIS code)
SEQUENCE_LOG_CLAMP = 20.0  # |log w| bound for the sequence product (verl's safety bound exp(+-20))


def check_is_options(level: str, mode: str, high: float, low: float | None) -> None:
    """ValueError naming the option when a level, mode or bound is not valid."""
    if level not in IS_LEVELS:
        raise ValueError(f"importance-weight level must be one of {IS_LEVELS}, got {level!r}.")
    if mode not in IS_MODES:
        raise ValueError(f"importance-weight mode must be one of {IS_MODES}, got {mode!r}.")
    if not high > 0:
        raise ValueError(f"the upper importance-weight bound (tis_cap) must be > 0 (e.g. 2.0), got {high!r}.")
    if low is not None and not (mode == "mask" and 0 <= low <= high):
        raise ValueError(
            f"a lower importance-weight bound (is_low={low!r}) needs mode 'mask' and 0 <= low <= "
            f"high ({high}); truncation only caps from above."
        )


def log_weights(log_ratio: Tensor, mask: Tensor, level: str = "token") -> Tensor:
    """log w (N, T) at ``level`` from the per-token log-ratio (N, T) log pi_old - log pi_sampler and the bool mask
    (N, T); row-level weights are broadcast over the row; 0 off the mask."""
    d = log_ratio.masked_fill(~mask, 0.0)
    if level == "token":
        out = d.clamp(-TOKEN_LOG_CLAMP, TOKEN_LOG_CLAMP)
    elif level == "sequence":
        out = d.sum(dim=1, keepdim=True).clamp(-SEQUENCE_LOG_CLAMP, SEQUENCE_LOG_CLAMP).expand_as(d)
    elif level == "geometric":
        n_tok = mask.sum(dim=1, keepdim=True).clamp(min=1)  # (N, 1)
        out = (d.sum(dim=1, keepdim=True) / n_tok).clamp(-TOKEN_LOG_CLAMP, TOKEN_LOG_CLAMP).expand_as(d)
    else:
        raise ValueError(f"importance-weight level must be one of {IS_LEVELS}, got {level!r}.")
    return out.masked_fill(~mask, 0.0)


def importance_weights(
    log_ratio: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    high: float = 2.0,
    low: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The weights w' (N, T) to multiply the per-token surrogate by (detached; 0 off the mask) and their stats.

    Stats (shares and means over completion tokens; a row-level weight counts once per token of its row):
    weight_mean, weight_max of w' (mode ``off``: of the unapplied w), clip_frac = share with w > high (truncate),
    masked_frac = share given weight 0 by the band (mask).
    """
    check_is_options(level, mode, high, low)
    m = mask.bool()
    raw = torch.exp(log_weights(log_ratio.detach(), m, level))  # (N, T)
    stats = {"clip_frac": 0.0, "masked_frac": 0.0}
    if mode == "truncate":
        weight = raw.clamp(max=high)
        stats["clip_frac"] = float(masked_mean((raw > high).float(), m))
    elif mode == "mask":
        lo = 1.0 / high if low is None else low
        keep = (raw >= lo) & (raw <= high)  # (N, T)
        weight = raw * keep
        stats["masked_frac"] = float(masked_mean((~keep).float(), m))
    else:
        weight = torch.ones_like(raw)
    shown = raw if mode == "off" else weight
    stats["weight_mean"] = float(masked_mean(shown, m))
    stats["weight_max"] = float(shown.masked_fill(~m, float("-inf")).max()) if bool(m.any()) else 0.0
    return weight.masked_fill(~m, 0.0), stats


def offpolicy_mask(
    log_ratio: Tensor, mask: Tensor, threshold: float, advantages: Tensor | None = None, rows: str = "all"
) -> Tensor:
    """Bool (N, T): False on the tokens the off-policy sequence mask drops (and off the mask).

    m_i = mean over the row's tokens of log_ratio (log pi_old - log pi_sampler). ``rows="all"``: a row with
    |m_i| > threshold is dropped whole. ``rows="negative"`` (DeepSeek-V3.2): tokens with advantage < 0 in rows
    with m_i < -threshold are dropped; needs ``advantages`` (N,) or (N, T).
    """
    if not threshold > 0:
        raise ValueError(
            f"the off-policy mask threshold is a mean log-ratio in nats and must be > 0 (e.g. 0.5), got {threshold!r}."
        )
    if rows not in OFFPOLICY_ROWS:
        raise ValueError(f"offpolicy mask rows must be one of {OFFPOLICY_ROWS}, got {rows!r}.")
    m = mask.bool()
    n_tok = m.sum(dim=1, keepdim=True).clamp(min=1)  # (N, 1)
    mean = log_ratio.detach().masked_fill(~m, 0.0).sum(dim=1, keepdim=True) / n_tok  # (N, 1)
    if rows == "all":
        return m & (mean.abs() <= threshold)
    if advantages is None:
        raise ValueError(
            "the off-policy mask with rows='negative' drops tokens with a negative advantage: pass `advantages`."
        )
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # (N, 1) or (N, T)
    return m & ~((adv < 0) & (mean < -threshold))
