"""Rollouts: prompts in, `RolloutBatch` out (token ids, sampler log-probs, masks, finish reasons, text), in three
families around `types` (`SamplingParams`, `RolloutBatch`) and `protocol` (`Engine`, `GroupSampler`):

- `engines/`: complete token-id prompts (HF with a KV cache, vLLM colocated or on servers), picked by `make_engine`;
- `samplers/`: a step's G completions per prompt over an engine, Ray workers or vLLM servers, or multi-turn episodes,
  picked by `make_sampler`;
- `tools/`: tools, environments and the multi-turn loop.

The names below import on first use (PEP 562), so that a light submodule (`engines.section`, `tools.section`)
imports without torch and transformers: `lmrl.cli` checks a config before any heavy import."""

import importlib

_EXPORTS = {
    "HFEngine": "lmrl.rollout.engines.hf",
    "StopStringMatcher": "lmrl.rollout.engines.stop_strings",
    "sample_next_token": "lmrl.rollout.engines.sampling",
    "top_k_filter": "lmrl.rollout.engines.sampling",
    "top_p_filter": "lmrl.rollout.engines.sampling",
    "RolloutBatch": "lmrl.rollout.types",
    "SamplingParams": "lmrl.rollout.types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lmrl.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
