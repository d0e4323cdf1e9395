"""Length rewards over `completion_lengths` (tokens, supplied by the trainer): `length` and `overlong`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lmrl.rewards.columns import get_column
from lmrl.rewards.registry import RewardFn, register_reward

_LENGTHS_HINT = "The trainer supplies it (completion lengths in tokens); pass it when calling the reward yourself."


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13):

    0                                   if L <= L_max - L_cache
    ((L_max - L_cache) - L) / L_cache   if L_max - L_cache < L <= L_max
    -1                                  if L > L_max
    """
    threshold = max_len - cache_len
    if length <= threshold:
        return 0.0
    if length <= max_len:
        return (threshold - length) / cache_len
    return -1.0


def target_length_reward(length: int, target: int) -> float:
    """r = max(-1, -|L - target| / target): 0 at the target, -1 at length 0 or 2*target and beyond."""
    return max(-1.0, -abs(length - target) / target)


def _lengths(columns: dict[str, Any], n: int, reward: str) -> list[int]:
    lengths = get_column(columns, "completion_lengths", n, reward, _LENGTHS_HINT)
    return [int(x) for x in lengths]


@register_reward("overlong")
def make_overlong_reward(max_len: int | None = None, cache_len: int | None = None) -> RewardFn:
    """`overlong`: DAPO soft overlong punishment, see `overlong_penalty`; in [-1, 0].

    max_len (L_max): the longest completion allowed, usually the trainer's max completion tokens.
    cache_len (L_cache): the soft buffer below max_len over which the penalty ramps from 0 to -1
    (DAPO: L_max = 20480, L_cache = 4096).
    """
    if not isinstance(max_len, int) or not isinstance(cache_len, int) or not 0 < cache_len <= max_len:
        raise ValueError(
            f"Reward 'overlong' needs integers 0 < cache_len <= max_len, got max_len={max_len!r}, "
            f"cache_len={cache_len!r}. Set `reward_kwargs.overlong` to e.g. {{max_len: 512, cache_len: 128}} "
            "(max_len is usually the max completion length; DAPO uses 20480 and 4096)."
        )

    def overlong(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        lengths = _lengths(columns, len(completions), "overlong")
        return [overlong_penalty(n, max_len, cache_len) for n in lengths]

    return overlong


@register_reward("length")
def make_length_reward(mode: str = "penalty", coef: float | None = None, target: int | None = None) -> RewardFn:
    """`length`: a reward on the completion length L in tokens.

    mode="penalty": r = -coef * L, a per-token cost (coef defaults to 0.001, so 100 tokens cost 0.1).
    mode="target":  r = max(-1, -|L - target| / target), see `target_length_reward`.
    (Length control, RLHF book §7.2.3 item 8.)
    """
    if mode == "penalty":
        coef = 0.001 if coef is None else coef
        if target is not None or not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
            raise ValueError(
                f"Reward 'length' with mode='penalty' takes a finite coef >= 0 and no target, got "
                f"coef={coef!r}, target={target!r}. Use mode='target' for a target length."
            )
        per_token = float(coef)

        def score(n: int) -> float:
            return -per_token * n

    elif mode == "target":
        if coef is not None or not isinstance(target, int) or target <= 0:
            raise ValueError(
                f"Reward 'length' with mode='target' takes a positive integer target and no coef, got "
                f"target={target!r}, coef={coef!r}. Use mode='penalty' for a per-token cost."
            )
        goal = target

        def score(n: int) -> float:
            return target_length_reward(n, goal)

    else:
        raise ValueError(f"Reward 'length': mode must be 'penalty' or 'target', got {mode!r}.")

    def length(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        return [score(n) for n in _lengths(columns, len(completions), "length")]

    return length
