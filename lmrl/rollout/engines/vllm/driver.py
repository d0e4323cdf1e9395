"""The part of the vLLM engine that touches vLLM: start a `vllm.LLM` on a model config, load weights into it in
place, sample token ids with per-token log-probs. `VLLMEngine` uses it in the trainer's process (colocated);
`lmrl vllm-serve` wraps the same class behind HTTP (server mode), so both modes sample identically.

    driver = VLLMDriver(config_dict, "LlamaForCausalLM", VLLMOptions(max_model_len=256), device_type="cpu")
    driver.load_weights([(name, tensor), ...], tied=False)
    tokens, logps, stopped = driver.sample(prompt_ids, n=4, temperature=0.7, max_tokens=32, stop_token_ids=[2],
                                           seeds=[11, 12])

- Start: the config (not the weights) goes to a temporary directory and vLLM starts on it with dummy weights and no
  tokenizer; the first `load_weights` brings the real ones.
- Load: vLLM 0.32's in-place layerwise reload (`collective_rpc("reload_weights", weights_iterator=...,
  is_checkpoint_format=True)`), the tied-head re-pack on CPU (MoE experts: re-packed inside the reload, by the hook
  `install_moe_repack` puts in at start), then a prefix-cache reset (no KV from old weights).
- Sample: one request per prompt with `n` children (prompt-major, sharing the prompt's KV), `logprobs=0` in
  `processed_logprobs` mode = log_softmax(logits / T) of each sampled token, stop ids kept, per-prompt seeds.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import random
import tempfile
from collections.abc import Iterable

import numpy as np
import torch

from lmrl.rollout.engines.vllm.weights import install_moe_repack, repack_tied_head


@dataclasses.dataclass
class VLLMOptions:
    """How the engine starts (from `EngineSection` via `lmrl.rollout.engines.factory.vllm_options`)."""

    max_model_len: int
    dtype: torch.dtype = torch.float32
    gpu_memory_utilization: float = 0.3
    kv_cache_gb: float = 1.0
    sleep: bool = False
    seed: int = 0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    lora_rank: int = 0  # vllm_lora_sync=adapter: vLLM serves LoRA adapters up to this rank (0: none)

    def to_dict(self) -> dict:
        """JSON-able (the dtype by name), for the server's /init."""
        return {**dataclasses.asdict(self), "dtype": str(self.dtype).removeprefix("torch.")}

    @classmethod
    def from_dict(cls, data: dict) -> VLLMOptions:
        return cls(**{**data, "dtype": getattr(torch, data.get("dtype", "float32"))})


class VLLMDriver:
    """A running `vllm.LLM` for one model architecture: `load_weights`, `sample`, and (GPU) `sleep`/`wake_up`."""

    def __init__(self, config: dict, architecture: str, options: VLLMOptions, device_type: str = "cpu"):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the weights are pushed as tensors
        self.options = options
        self._config_dir = tempfile.TemporaryDirectory(prefix="lmrl-vllm-")
        with open(os.path.join(self._config_dir.name, "config.json"), "w") as f:
            json.dump({**config, "architectures": [architecture]}, f)  # config only: the weights come from memory
        self.llm = start_llm(self._config_dir.name, options, device_type)
        self.moe_layers = sum(self.llm.collective_rpc(install_moe_repack))  # CPU: experts re-packed after a reload
        self.lora, self.adapters = None, 0  # vllm_lora_sync=adapter: the adapter every request samples with

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], tied: bool) -> None:
        """Every weight, by checkpoint name, into the running engine in place; `tied`: re-pack a tied LM head."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if tied:
            self.llm.collective_rpc(repack_tied_head)
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights

    def load_adapter(self, path: str) -> None:
        """The LoRA adapter saved at `path` (peft format) is what every later request samples with: a new adapter id
        each time, so vLLM loads the files anew (the old one is evicted, max_loras=1)."""
        from vllm.lora.request import LoRARequest

        self.adapters += 1
        self.lora = LoRARequest("lmrl-policy", self.adapters, path)
        self.llm.reset_prefix_cache()  # cached KV was computed with the old adapter

    def sample(
        self,
        prompt_ids: list[list[int]],
        n: int,
        temperature: float,
        max_tokens: int,
        stop_token_ids: list[int],
        seeds: list[int],
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """n completions per prompt (temperature 0: greedy): prompt-major token ids, their log-probs, stopped flags."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        requests = [
            VLLMSamplingParams(
                n=n,
                temperature=temperature,
                max_tokens=max_tokens,
                logprobs=0,
                ignore_eos=True,
                stop_token_ids=list(stop_token_ids),
                detokenize=False,
                seed=int(seed),
            )
            for seed in seeds
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompt_ids], requests, use_tqdm=False, lora_request=self.lora
        )
        rows = [sorted(out.outputs, key=lambda c: c.index) for out in outputs]  # prompt-major, children in order
        tokens = [list(c.token_ids) for group in rows for c in group]  # N lists
        logps = [[c.logprobs[j][t].logprob for j, t in enumerate(c.token_ids)] for group in rows for c in group]
        stopped = [c.finish_reason == "stop" for group in rows for c in group]
        return tokens, logps, stopped

    def sleep(self) -> None:
        self.llm.sleep(level=2)

    def wake_up(self, tags: list[str]) -> None:
        self.llm.wake_up(tags=tags)

    def close(self) -> None:
        """Nothing to stop: vLLM runs in this process and goes with it."""


def start_llm(model_dir: str, options: VLLMOptions, device_type: str):
    """`vllm.LLM` on `model_dir` with dummy weights, leaving the process as it found it: vLLM reseeds the global
    RNGs and replaces `torch.set_num_threads` with a no-op on CPU (shared/notes/vllm-cpu.md); both are restored.

    Several trainer processes (torchrun): every rank starts its own engine, all at once (vLLM joins the ranks'
    process group and forms its tensor-parallel groups of one rank each, a collective; measured on CPU).

    On CPU, chunked prefill is off: vLLM 0.32 rewinds a seeded request's generator after a partial prefill with
    `set_offset`, which CPU generators refuse ("CPU Generator does not use offset"), so a batch whose prompts exceed
    one step's token budget crashed. Without chunking every prompt is prefilled whole (budget >= max_model_len)."""
    from vllm import LLM

    # an engine dropped but not yet collected tears down vLLM's process-wide parallel groups when it is collected
    # (EngineCore.shutdown -> cleanup_dist_env_and_memory): collect it now, not while this engine relies on them
    gc.collect()
    with open(os.path.join(model_dir, "config.json")) as f:
        make_room_for_experts(json.load(f))
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    cuda = device_type == "cuda"
    kwargs = (
        dict(gpu_memory_utilization=options.gpu_memory_utilization, enable_sleep_mode=options.sleep)
        if cuda
        else dict(
            kv_cache_memory_bytes=int(options.kv_cache_gb * 2**30),
            enable_chunked_prefill=False,
            max_num_batched_tokens=max(options.max_num_batched_tokens, options.max_model_len),
        )
    )
    if options.lora_rank:  # vllm_lora_sync=adapter
        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=options.lora_rank)
    if cuda and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun ranks: each engine on its rank's GPU, as
        kwargs["distributed_executor_backend"] = "external_launcher"  # TRL's colocate mode does (untested here)
    try:
        llm = LLM(
            model=model_dir,
            skip_tokenizer_init=True,
            load_format="dummy",
            generation_config="vllm",
            dtype=str(options.dtype).removeprefix("torch."),
            max_model_len=options.max_model_len,
            max_num_seqs=options.max_num_seqs,
            seed=options.seed,
            enforce_eager=not cuda,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
    finally:
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            set_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
    return llm


MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")  # HF config keys that make a model MoE


def make_room_for_experts(config: dict) -> None:
    """vLLM keeps its parallel groups per process, made by the first engine, and a dense model's leave out the
    expert-parallel group: an MoE engine started later in the same process failed ("expert parallel group is not
    initialized"). Before an MoE engine starts where the groups lack it, they are torn down for this engine to make
    anew, with the same sizes (one rank each: engines already running see no difference)."""
    if not any(config.get(key) for key in MOE_KEYS):
        return
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized() and parallel_state._EP is None:
        parallel_state.destroy_model_parallel()
