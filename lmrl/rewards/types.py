"""The reward-function contract, shared by the registry and every reward module.

    RewardFn:      fn(prompts: list[str], completions: list[str], **columns) -> list[float]
    RewardFactory: factory(**options) -> RewardFn  (what `REWARDS` maps a name to)

A module that only returns a reward function (e.g. `reward_model`) imports these from here,
not from `lmrl.rewards.registry`, so the registry can import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

RewardFn = Callable[..., Sequence[float]]
RewardFactory = Callable[..., RewardFn]
