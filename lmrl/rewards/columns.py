"""Reading per-sample columns inside reward functions."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from lmrl.rewards.errors import MissingColumnError


def get_column(columns: Mapping[str, Any], name: str, n: int, reward: str, hint: str = "") -> Sequence[Any]:
    """`columns[name]`, checked to hold one value per completion (n of them)."""
    if name not in columns or columns[name] is None:
        raise MissingColumnError(reward, name, [k for k, v in columns.items() if v is not None], hint)
    values = columns[name]
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != n:
        size = len(values) if isinstance(values, Sequence) else type(values).__name__
        raise ValueError(
            f"Reward '{reward}': column '{name}' must be a list with one value per completion "
            f"({n}), got {size}. Pass dataset columns as lists aligned with `completions`."
        )
    return values


def as_meta(value: Any, reward: str = "task") -> dict[str, Any]:
    """A sample's `meta` as a dict: accepts a dict, a JSON object string, or None/"" (empty)."""
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"Reward '{reward}': `meta` is not valid JSON ({err}): {value[:200]!r}.") from None
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(
        f"Reward '{reward}': `meta` must be a dict or a JSON object string, got "
        f"{type(value).__name__} {str(value)[:200]!r}."
    )
