"""Rollout engines: token-id prompts in, a `RolloutBatch` out (`lmrl.rollout.protocol.Engine`).

- `factory`: `make_engine`, the ``ENGINES`` table every sampling verb picks its engine from, and engine=vllm's
  start-up checks; `section`: the config keys that pick and set up the engine (torch-free: `lmrl.cli` checks a
  config before any heavy import, so this package imports nothing on its own);
- `hf`: `HFEngine`, batched KV-cache sampling from the training model (`kv_cache`, `sampling`);
- `vllm/`: `VLLMEngine`, vLLM in this process or behind `lmrl vllm-serve` servers, with in-place weight pushes;
- `assemble` and `stop_strings`: what both engines share: pad and stop ids, the checks of a request, left padding,
  stop strings, and the one `RolloutBatch` layout.
"""
