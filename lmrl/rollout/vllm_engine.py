"""The vLLM rollout engine, colocated: vLLM runs in the trainer's process and samples with the training model's
current weights, pushed into the running engine in place (never by a restart or through files).

    engine = VLLMEngine(model, tokenizer, VLLMOptions(max_model_len=256), optimizer)
    batch = engine.generate(prompt_ids, SamplingParams(max_new_tokens=32, temperature=0.7), n=8, generator=g)

- Start: the model's config (not its weights) goes to a temporary directory and vLLM starts on it with dummy
  weights (`load_format="dummy"`, no tokenizer: lmrl tokenizes and decodes, exactly as for the HF engine); the
  first `generate` pushes the real weights.
- Sync: `optimizer.register_step_post_hook` marks the engine stale after every optimizer step; the next `generate`
  pushes every weight in place (`vllm_weights`: merged LoRA, the tied-head re-pack on CPU) and resets the prefix
  cache (no KV from old weights is reused). `set_model` does the same for a replaced model (rejection rounds).
- The same `RolloutBatch` as `HFEngine`: prompt-major rows (one request per prompt, `n` children sharing the
  prompt's KV through prefix caching), `sampler_logp` = log_softmax(logits / T) of each sampled token (vLLM's
  `processed_logprobs`; exact for top_k=0, top_p=1, which is why other settings are refused), stop token ids kept,
  stop strings applied with HFEngine's own `StopStringMatcher` (rows do not end early inside vLLM).
- Sampling is reproducible: each prompt's request gets a seed drawn from `generator` (children: seed + index).

The design follows TRL's colocate mode (`trl/generation/vllm_generation.py`: LLM in the trainer process, weights
loaded in place after each step, `vllm_enable_sleep_mode`); the in-place reload is vLLM 0.32's
`reload_weights` (measured on CPU in shared/notes/vllm-cpu.md).
"""

from __future__ import annotations

import dataclasses
import os
import random
import tempfile
import time

import numpy as np
import torch

from lmrl.rollout.hf import StopStringMatcher, _left_pad, pad_token_id, stop_token_ids
from lmrl.rollout.types import RolloutBatch, SamplingParams
from lmrl.rollout.vllm_weights import hf_weights, is_peft_model, merged_adapters, repack_tied_head

SEED_RANGE = 2**31 - 1


@dataclasses.dataclass
class VLLMOptions:
    """How the engine starts (from `EngineSection` via `lmrl.rollout.engines.vllm_options`)."""

    max_model_len: int
    dtype: torch.dtype = torch.float32
    gpu_memory_utilization: float = 0.3
    kv_cache_gb: float = 1.0
    sleep: bool = False
    seed: int = 0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192


def base_model(model):
    """The HF model under a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if is_peft_model(model) else model


class VLLMEngine:
    """vLLM in this process, sampling with `model`'s current weights; returns a `RolloutBatch` like `HFEngine`."""

    def __init__(self, model, tokenizer, options: VLLMOptions, optimizer: torch.optim.Optimizer | None = None):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the weights are pushed as tensors
        self.model, self.tokenizer, self.options = model, tokenizer, options
        self.device = next(model.parameters()).device
        self.tied = bool(getattr(base_model(model).config, "tie_word_embeddings", False))
        self._config_dir = tempfile.TemporaryDirectory(prefix="lmrl-vllm-")
        config = base_model(model).config.__class__.from_dict(base_model(model).config.to_dict())
        config.architectures = [type(base_model(model)).__name__]
        config.save_pretrained(self._config_dir.name)  # config only: the weights come from memory
        self.llm = start_llm(self._config_dir.name, options, self.device)
        self.stale, self.sleeping = True, False
        self.syncs, self.last_sync_s = 0, 0.0
        self._matchers: dict[tuple[str, ...], StopStringMatcher] = {}
        if optimizer is not None:
            self.watch(optimizer)

    # -- weights ---------------------------------------------------------------------------------------------

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Sync after every step of `optimizer` (lazily: at the next `generate`)."""
        optimizer.register_step_post_hook(lambda *_: self.mark_stale())

    def mark_stale(self) -> None:
        self.stale = True

    def set_model(self, model) -> None:
        """Sample from `model` from now on (same architecture; e.g. the next round's policy); synced at `generate`."""
        self.model = model
        self.stale = True

    def sync_weights(self) -> float:
        """Push every weight of the model into the running engine in place; returns the seconds it took."""
        t0 = time.perf_counter()
        if self.sleeping:
            self.llm.wake_up(tags=["weights"])
        with torch.no_grad(), merged_adapters(self.model):
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_iterator": hf_weights(self.model, self.options.dtype), "is_checkpoint_format": True})
        if self.tied:
            self.llm.collective_rpc(repack_tied_head)
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        self.stale = False
        self.syncs += 1
        self.last_sync_s = time.perf_counter() - t0
        return self.last_sync_s

    # -- sampling --------------------------------------------------------------------------------------------

    @property
    def pad_token_id(self) -> int:
        return pad_token_id(self.tokenizer)

    def stop_token_ids(self, params: SamplingParams) -> tuple[int, ...]:
        return stop_token_ids(self.tokenizer, params)

    def generate_text(self, prompts: list[str], params: SamplingParams, n: int = 1,
                      generator: torch.Generator | None = None) -> RolloutBatch:
        """`generate` on already-rendered prompt strings (tokenized with add_special_tokens=False)."""
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise ValueError("VLLMEngine.generate_text takes a list of prompt strings; wrap a single prompt in a list.")
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        return self._generate(ids, params, n, generator, list(prompts))

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, n: int = 1,
                 generator: torch.Generator | None = None, record_linear_outputs: bool = False) -> RolloutBatch:
        """Sample n completions for each prompt (token ids, unpadded); rows are prompt-major (N = len * n).

        Deterministic given `generator` (one seed per prompt is drawn from it). record_linear_outputs is accepted for
        `HFEngine` compatibility and ignored: vLLM's forwards are not the learner's, so there is nothing to reuse."""
        prompt_ids = [p.tolist() if isinstance(p, torch.Tensor) else list(p) for p in prompt_ids]
        return self._generate(prompt_ids, params, n, generator, None)

    def _generate(self, prompt_ids, params, n, generator, prompt_texts) -> RolloutBatch:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        self._check_inputs(prompt_ids, params, n)
        if self.stale:
            self.sync_weights()
        if self.sleeping:
            self.llm.wake_up(tags=["kv_cache"])
            self.sleeping = False
        seeds = torch.randint(0, SEED_RANGE, (len(prompt_ids),), generator=generator,
                              device=generator.device if generator is not None else "cpu").tolist()
        stop_ids = list(self.stop_token_ids(params))
        requests = [VLLMSamplingParams(
            n=n, temperature=0.0 if params.greedy else params.temperature, top_p=params.top_p, top_k=params.top_k,
            max_tokens=params.max_new_tokens, logprobs=0, ignore_eos=True, stop_token_ids=stop_ids, detokenize=False,
            seed=int(seed)) for seed in seeds]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], requests, use_tqdm=False)
        if self.options.sleep:  # give the memory back to training until the next rollout (weights then re-pushed)
            self.llm.sleep(level=2)
            self.sleeping, self.stale = True, True
        rows = [sorted(out.outputs, key=lambda c: c.index) for out in outputs]  # prompt-major, children in order
        tokens = [list(c.token_ids) for group in rows for c in group]  # N lists
        logps = [[c.logprobs[j][t].logprob for j, t in enumerate(c.token_ids)] for group in rows for c in group]
        stopped = [c.finish_reason == "stop" for group in rows for c in group]
        return self._assemble(prompt_ids, prompt_texts, tokens, logps, stopped, params, n)

    def _assemble(self, prompt_ids, prompt_texts, tokens, logps, stopped, params, n) -> RolloutBatch:
        """Tensors and texts laid out exactly as `HFEngine._assemble` does."""
        pad, width = self.pad_token_id, max(len(t) for t in tokens)
        out_ids = torch.full((len(tokens), width), pad, dtype=torch.long)  # (N, T)
        out_logp = torch.zeros(len(tokens), width, dtype=torch.float32)  # (N, T)
        for i, (ids, lps) in enumerate(zip(tokens, logps)):
            out_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            out_logp[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
        lengths = torch.tensor([len(t) for t in tokens])  # (N,)
        stopped_t = torch.tensor(stopped, dtype=torch.bool)  # (N,)
        matcher = self._matcher(params.stop_strings) if params.stop_strings else None
        if matcher is not None:
            lengths, stopped_t = apply_stop_strings(matcher, out_ids, lengths, stopped_t)
        completion_mask = (torch.arange(width)[None, :] < lengths[:, None]).float()  # (N, T)
        out_ids = out_ids.masked_fill(completion_mask == 0, pad)
        out_logp = out_logp * completion_mask
        width = int(lengths.max())
        out_ids, out_logp, completion_mask = out_ids[:, :width], out_logp[:, :width], completion_mask[:, :width]
        texts = self.tokenizer.batch_decode([row[:k] for row, k in zip(out_ids.tolist(), lengths.tolist())],
                                            skip_special_tokens=True)
        if matcher is not None:
            texts = [matcher.cut(t)[0] for t in texts]
        if prompt_texts is None:
            prompt_texts = self.tokenizer.batch_decode(prompt_ids, skip_special_tokens=False)
        ids, mask = _left_pad(prompt_ids, pad, torch.device("cpu"))  # (B, P)
        truncated = ~stopped_t
        return RolloutBatch(
            prompt_ids=ids.repeat_interleave(n, dim=0).to(self.device),
            prompt_mask=mask.repeat_interleave(n, dim=0).to(self.device),
            completion_ids=out_ids.to(self.device), completion_mask=completion_mask.to(self.device),
            sampler_logp=out_logp.to(self.device), truncated=truncated.to(self.device),
            finish_reason=["length" if t else "stop" for t in truncated.tolist()],
            prompts=[text for text in prompt_texts for _ in range(n)], completions=texts, group_size=n,
        )

    def _matcher(self, stop_strings: tuple[str, ...]) -> StopStringMatcher:
        if stop_strings not in self._matchers:
            vocab = base_model(self.model).get_output_embeddings().weight.shape[0]
            self._matchers[stop_strings] = StopStringMatcher(self.tokenizer, stop_strings, vocab, torch.device("cpu"))
        return self._matchers[stop_strings]

    def _check_inputs(self, prompt_ids, params: SamplingParams, n: int) -> None:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"VLLMEngine.generate takes a SamplingParams, got {type(params).__name__}.")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"VLLMEngine.generate: n (completions per prompt) must be an int >= 1, got {n!r}.")
        check_exact_logprobs(params)
        if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
            raise ValueError("VLLMEngine.generate: prompt_ids must be a non-empty list of non-empty token-id lists.")
        vocab = base_model(self.model).get_input_embeddings().num_embeddings
        if any(not 0 <= t < vocab for p in prompt_ids for t in p):
            raise ValueError(f"VLLMEngine.generate: prompt token ids must be in [0, {vocab}) (the model's vocabulary).")
        longest = max(len(p) for p in prompt_ids)
        if longest + params.max_new_tokens > self.options.max_model_len:
            raise ValueError(
                f"engine=vllm: the longest prompt ({longest} tokens) plus max_new_tokens={params.max_new_tokens} "
                f"exceeds vllm_max_model_len={self.options.max_model_len}; raise vllm_max_model_len (up to the "
                "model's max_position_embeddings) or shorten the prompts / max_new_tokens.")


def check_exact_logprobs(params: SamplingParams) -> None:
    """vLLM returns log_softmax(logits / T) of the sampled token (lmrl's `sampler_logp`) only without top-k/top-p
    truncation; with it, its log-probs are those of the truncated distribution. Refuse what would differ."""
    if not params.greedy and (params.top_k > 0 or params.top_p < 1):
        raise ValueError(
            f"engine=vllm samples with top_k=0 and top_p=1 only (got top_k={params.top_k}, top_p={params.top_p}): "
            "with truncation vLLM's log-probs are not lmrl's sampler_logp (the full distribution's). Set top_k=0 "
            "top_p=1, or use engine=hf.")
    if params.greedy and params.logp_temperature != 1.0:
        raise ValueError(f"engine=vllm: greedy decoding stores temperature-1 log-probs; got temperature="
                         f"{params.temperature}. Use temperature=0 (or 1) with greedy, or engine=hf.")


def apply_stop_strings(matcher: StopStringMatcher, out_ids: torch.Tensor, lengths: torch.Tensor,
                       stopped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Replay `HFEngine`'s per-step stop-string check on finished rows: (N, T) ids, lengths (N,), stopped (N,) ->
    new lengths and stopped. A row ends at the first step whose decoded tail contains a stop string."""
    lengths, stopped = lengths.clone(), stopped.clone()
    done = torch.zeros_like(stopped)  # (N,)
    for step in range(out_ids.shape[1]):
        running = (step < lengths) & ~done  # (N,)
        if not running.any():
            break
        lo = max(0, step + 1 - matcher.window)
        hit = matcher(out_ids[:, lo : step + 1], out_ids[:, step], running)  # (N,)
        lengths[hit], stopped[hit] = step + 1, True
        done |= hit | (step + 1 >= lengths)
    return lengths, stopped


def start_llm(model_dir: str, options: VLLMOptions, device: torch.device):
    """`vllm.LLM` on `model_dir` with dummy weights, leaving the process as it found it: vLLM reseeds the global
    RNGs and replaces `torch.set_num_threads` with a no-op on CPU (shared/notes/vllm-cpu.md); both are restored.

    On CPU, chunked prefill is off: vLLM 0.32 rewinds a seeded request's generator after a partial prefill with
    `set_offset`, which CPU generators refuse ("CPU Generator does not use offset"), so a batch whose prompts exceed
    one step's token budget crashed. Without chunking every prompt is prefilled whole (budget >= max_model_len)."""
    from vllm import LLM

    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    cuda = device.type == "cuda"
    kwargs = dict(gpu_memory_utilization=options.gpu_memory_utilization, enable_sleep_mode=options.sleep) if cuda \
        else dict(kv_cache_memory_bytes=int(options.kv_cache_gb * 2**30), enable_chunked_prefill=False,
                  max_num_batched_tokens=max(options.max_num_batched_tokens, options.max_model_len))
    try:
        llm = LLM(model=model_dir, skip_tokenizer_init=True, load_format="dummy", generation_config="vllm",
                  dtype=str(options.dtype).removeprefix("torch."), max_model_len=options.max_model_len,
                  max_num_seqs=options.max_num_seqs, seed=options.seed, enforce_eager=not cuda,
                  enable_prefix_caching=True, logprobs_mode="processed_logprobs", **kwargs)
    finally:
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            set_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
    return llm
