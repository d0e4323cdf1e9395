"""Rollout engines: prompts in, `RolloutBatch` out (token ids, sampler log-probs, masks, finish reasons, text)."""

from lmrl.rollout.hf import HFEngine, StopStringMatcher
from lmrl.rollout.sampling import sample_next_token, top_k_filter, top_p_filter
from lmrl.rollout.types import RolloutBatch, SamplingParams

__all__ = [
    "HFEngine",
    "RolloutBatch",
    "SamplingParams",
    "StopStringMatcher",
    "sample_next_token",
    "top_k_filter",
    "top_p_filter",
]
