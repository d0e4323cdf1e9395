"""Pure tensor functions and registries for RL of language models (no I/O, no models).

Layout: B prompts x G samples are prompt-major (rewards of prompt i are
``rewards.view(-1, G)[i]``); per-token tensors are (N, T) with a 0/1 `mask` that
is 1 on completion tokens only. Append new modules' re-exports below.
"""

from .advantages import ADVANTAGES, advantages, gae, group_stats, whiten, zero_variance_groups
from .aggregation import AGGREGATIONS, aggregate, global_share, masked_mean
from .kl import KL_ESTIMATORS, kl, kl_penalized_rewards
from .policy_losses import POLICY_LOSSES, policy_loss
from .registry import Registry
from .value import value_loss

__all__ = [
    "Registry",
    "AGGREGATIONS",
    "aggregate",
    "global_share",
    "masked_mean",
    "ADVANTAGES",
    "advantages",
    "gae",
    "group_stats",
    "whiten",
    "zero_variance_groups",
    "KL_ESTIMATORS",
    "kl",
    "kl_penalized_rewards",
    "POLICY_LOSSES",
    "policy_loss",
    "value_loss",
]

from .avatarl import AvatarlOptions, AvatarlRewards, avatarl_rewards
from .avatarl_reinforce import avatarl_loss
from .best_of_n import bon_expected, bon_kl_bound, bon_kl_empirical, select_best, select_top_k
from .controls import adaptive_entropy_coef, adaptive_kl_coef, high_entropy_tokens, overlong_filter
from .mismatch import IS_LEVELS, IS_MODES, OFFPOLICY_ROWS, importance_weights, offpolicy_mask
from .preference import (
    PREFERENCE_LOSSES,
    RunningDelta,
    implicit_rewards,
    kto_reference_kl,
    preference_loss,
    preference_stats,
)
from .reward_model import REWARD_MODEL_LOSSES, reward_model_loss
from .selfplay import challenger_advantages, selfplay_advantages, solver_advantages

__all__ += [
    "adaptive_entropy_coef",
    "adaptive_kl_coef",
    "high_entropy_tokens",
    "overlong_filter",
    "PREFERENCE_LOSSES",
    "RunningDelta",
    "implicit_rewards",
    "kto_reference_kl",
    "preference_loss",
    "preference_stats",
    "REWARD_MODEL_LOSSES",
    "reward_model_loss",
    "AvatarlOptions",
    "AvatarlRewards",
    "avatarl_loss",
    "avatarl_rewards",
    "bon_expected",
    "bon_kl_bound",
    "bon_kl_empirical",
    "select_best",
    "select_top_k",
    "challenger_advantages",
    "selfplay_advantages",
    "solver_advantages",
    "IS_LEVELS",
    "IS_MODES",
    "OFFPOLICY_ROWS",
    "importance_weights",
    "offpolicy_mask",
]
