"""Rollout engines: prompts in, `RolloutBatch` out (token ids, sampler log-probs, masks, finish reasons, text).

The names below import on first use (PEP 562), so that a light submodule (`engine_section`, `tool_config`) imports
without torch and transformers: `lmrl.cli` checks a config before any heavy import."""

import importlib

_EXPORTS = {
    "HFEngine": "lmrl.rollout.hf",
    "StopStringMatcher": "lmrl.rollout.hf",
    "sample_next_token": "lmrl.rollout.sampling",
    "top_k_filter": "lmrl.rollout.sampling",
    "top_p_filter": "lmrl.rollout.sampling",
    "RolloutBatch": "lmrl.rollout.types",
    "SamplingParams": "lmrl.rollout.types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lmrl.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
