"""Text rewards: `exact_match` and `format` (regex)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lmrl.rewards.columns import get_column
from lmrl.rewards.registry import RewardFn, register_reward

DEFAULT_FORMAT = r"^<think>.*?</think>\s*<answer>.*?</answer>$"


def normalize(text: str, ignore_case: bool = False) -> str:
    """`text.strip()`, case-folded if `ignore_case`."""
    text = text.strip()
    return text.casefold() if ignore_case else text


@register_reward("exact_match")
def make_exact_match(ignore_case: bool = False) -> RewardFn:
    """`exact_match`: r_i = 1 if normalize(completion_i) == normalize(answer_i) else 0.

    normalize strips surrounding whitespace and, with ignore_case=True, case-folds.
    """

    def exact_match(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        answers = get_column(columns, "answer", len(completions), "exact_match", "It holds the expected text.")
        return [
            float(normalize(str(c), ignore_case) == normalize(str(a), ignore_case))
            for c, a in zip(completions, answers)
        ]

    return exact_match


@register_reward("format")
def make_format_reward(pattern: str = DEFAULT_FORMAT, dotall: bool = True) -> RewardFn:
    """`format`: r_i = 1 if re.search(pattern, completion_i) matches else 0 (RLHF book §7.2.3, item 6).

    The default pattern asks for `<think>...</think>` then `<answer>...</answer>` and nothing
    else (DeepSeek-R1 style); with dotall=True `.` also matches newlines. Anchor your own
    pattern with ^ and $ if it must cover the whole completion (`$` also accepts one
    trailing newline).
    """
    try:
        regex = re.compile(pattern, re.DOTALL if dotall else 0)
    except re.error as err:
        raise ValueError(
            f"Reward 'format': pattern {pattern!r} is not a valid regular expression ({err}). "
            "Fix `reward_kwargs.format.pattern` (YAML: quote it and escape backslashes)."
        ) from None

    def format_reward(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        return [float(regex.search(str(c)) is not None) for c in completions]

    format_reward.__name__ = "format"
    return format_reward
