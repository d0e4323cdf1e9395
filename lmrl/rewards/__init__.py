"""Rewards: verifiers and user functions, registered by name and composed with weights.

    from lmrl.rewards import RewardSet
    rewards = RewardSet(["math", "format"], reward_weights=[1.0, 0.2])
    total, components, metrics = rewards.compute(prompts, completions, answer=answers)

Built-ins (`REWARDS`; options via `make_reward(name, **kwargs)`): `task`, `math`, `code`, `env`,
`exact_match`, `format`, `length`, `overlong`, `gold` (the built-in preference task), `judge` and
`rubric` (LLM judges), `openai_judge` (the same judges on an OpenAI-compatible chat endpoint). A user
function is 'module.path:function'; a reward model is 'model:PATH'; a reward server is 'http://host:port/path'.
"""

from lmrl.rewards import code, env, gold, judge, length, math_verifier, openai_judge, task, text  # noqa: F401  (registers the built-ins)
from lmrl.rewards.compose import ON_REWARD_ERROR, RewardResult, RewardSet
from lmrl.rewards.errors import MissingColumnError, RewardError, RewardFailure
from lmrl.rewards.length import overlong_penalty, target_length_reward
from lmrl.rewards.math_verifier import extract_answer, last_boxed, math_score
from lmrl.rewards.registry import REWARDS, RewardFn, load_reward, make_reward, register_reward, reward_name

__all__ = [
    "ON_REWARD_ERROR",
    "REWARDS",
    "MissingColumnError",
    "RewardError",
    "RewardFailure",
    "RewardFn",
    "RewardResult",
    "RewardSet",
    "extract_answer",
    "last_boxed",
    "load_reward",
    "make_reward",
    "math_score",
    "overlong_penalty",
    "register_reward",
    "reward_name",
    "target_length_reward",
]
