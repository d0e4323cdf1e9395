"""`env`: the reward a multi-turn environment gave a trajectory (the sum of its steps' rewards)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmrl.rewards.columns import get_column
from lmrl.rewards.registry import RewardFn, register_reward


@register_reward("env")
def make_env_reward() -> RewardFn:
    """`env`: r_i = sum of the rewards environment i returned from `step` (column `env_reward`, set by the
    multi-turn rollout of `lmrl rl env=...`)."""

    def env_reward(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        hint = "It is set by multi-turn rollouts (lmrl rl with env= or tools=)."
        return [float(r) for r in get_column(columns, "env_reward", len(completions), "env", hint)]

    env_reward.__name__ = "env"
    return env_reward
