"""The vLLM rollout engine: vLLM samples with the training model's current weights, pushed into the running engine
in place after every optimizer step (never by a restart or through files). Where vLLM runs is the driver's business:
in this process (`VLLMDriver`, colocated) or in a `lmrl vllm-serve` process (`RemoteVLLM`, server mode).

    engine = VLLMEngine(model, tokenizer, VLLMOptions(max_model_len=256))
    engine.sync(model, version)             # before each rollout: a new version is pushed at the next generate
    batch = engine.generate(prompt_ids, SamplingParams(max_new_tokens=32, temperature=0.7), n=8, generator=g)

- Start: vLLM starts on the model's config with dummy weights and no tokenizer (`vllm_driver`; lmrl tokenizes and
  decodes, exactly as for the HF engine); the first `generate` pushes the real weights.
- Sync: the trainer calls `sync(model, version)` before it samples (`lmrl.rollout.protocol`); a new version (or a
  replaced model: rejection rounds) marks the engine stale, and the next `generate` pushes every weight in place
  (`vllm_weights`: merged LoRA, the tied-head re-pack on CPU) and resets the prefix cache (no KV from old weights is
  reused). With `VLLMOptions.lora_rank` (vllm_lora_sync=adapter) the frozen base goes once per model and each sync
  writes only the LoRA adapter, which vLLM serves (`push_adapter`).
- The same `RolloutBatch` as `HFEngine`: prompt-major rows (one request per prompt, `n` children sharing the
  prompt's KV through prefix caching), `sampler_logp` = log_softmax(logits / T) of each sampled token (vLLM's
  `processed_logprobs`; exact for top_k=0, top_p=1, which is why other settings are refused), stop token ids kept,
  stop strings applied with HFEngine's own `StopStringMatcher` (rows do not end early inside vLLM).
- Sampling is reproducible: each prompt's request gets a seed drawn from `generator` (children: seed + index).

The design follows TRL's colocate mode (`trl/generation/vllm_generation.py`: LLM in the trainer process, weights
loaded in place after each step, `vllm_enable_sleep_mode`) and its `vllm-serve` for server mode; the in-place reload
is vLLM 0.32's `reload_weights` (measured on CPU in shared/notes/vllm-cpu.md).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import torch

from lmrl.rollout.hf import StopStringMatcher, _left_pad, pad_token_id, stop_token_ids
from lmrl.rollout.types import RolloutBatch, SamplingParams
from lmrl.rollout.vllm_driver import VLLMOptions
from lmrl.rollout.vllm_weights import architecture, hf_weights, is_peft_model, merged_adapters

SEED_RANGE = 2**31 - 1


def base_model(model):
    """The HF model under a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if is_peft_model(model) else model


def model_spec(model) -> tuple[dict, str]:
    """(config as a JSON-able dict, architecture class name): what vLLM needs to build the model (no weights). The
    class is the HF one under a PEFT or torch.distributed (FSDP/DDP) wrapper."""
    return json.loads(base_model(model).config.to_json_string()), architecture(model)


class VLLMEngine:
    """vLLM (here or in a server) sampling with `model`'s current weights; returns a `RolloutBatch` like `HFEngine`."""

    def __init__(self, model, tokenizer, options: VLLMOptions, driver=None):
        """driver: where vLLM runs; None starts a `VLLMDriver` in this process (colocated), a `RemoteVLLM`
        (`lmrl.rollout.vllm_client`) is a `lmrl vllm-serve` process (server mode). Both sample identically."""
        self.model, self.tokenizer, self.options = model, tokenizer, options
        self.device = next(model.parameters()).device
        self.tied = bool(getattr(base_model(model).config, "tie_word_embeddings", False))
        if driver is None:
            from lmrl.rollout.vllm_driver import VLLMDriver

            driver = VLLMDriver(*model_spec(model), options, self.device.type)
        self.driver = driver
        self.stale, self.sleeping = True, False  # vLLM starts on dummy weights: the first generate pushes
        self.version: int | None = None
        self.syncs, self.last_sync_s = 0, 0.0
        self.base_pushed, self.adapter_dir = None, None  # vllm_lora_sync=adapter
        self._matchers: dict[tuple[str, ...], StopStringMatcher] = {}

    # -- weights ---------------------------------------------------------------------------------------------

    def sync(self, model, version: int) -> None:
        """Sample `model` after `version` updates: a new version or another model is pushed at the next
        `generate` (lazily, so several updates between rollouts cost one push)."""
        if model is not self.model or version != self.version:
            self.model, self.version, self.stale = model, version, True

    def metrics(self) -> dict[str, float]:
        """``time/weight_sync_s``: the seconds of the last weight push."""
        return {"time/weight_sync_s": self.last_sync_s}

    def close(self) -> None:
        """A `lmrl vllm-serve` process this engine started is stopped; colocated vLLM goes with the process."""
        self.driver.close()

    def sync_weights(self) -> float:
        """Push every weight of the model into the running engine in place (vllm_lora_sync=adapter: the base
        weights once per model, then only the adapter); returns the seconds it took."""
        t0 = time.perf_counter()
        if self.sleeping:
            self.driver.wake_up(["weights"])
            self.base_pushed = None  # sleep level 2 dropped the weights
        if self.options.lora_rank:
            self.push_adapter()
        else:
            with torch.no_grad(), merged_adapters(self.model):
                self.driver.load_weights(hf_weights(self.model, self.options.dtype), self.tied)
        self.stale = False
        self.syncs += 1
        self.last_sync_s = time.perf_counter() - t0
        return self.last_sync_s

    def snapshot(self, model) -> list[bytes]:
        """Server mode, async_steps: `model`'s weights now, encoded for a later `push_snapshot` (the learner trains
        on meanwhile). Full weights (merged LoRA); vllm_lora_sync=adapter runs colocated only."""
        with torch.no_grad(), merged_adapters(model):
            return self.driver.encode_weights(hf_weights(model, self.options.dtype))

    def push_snapshot(self, parts: list[bytes]) -> None:
        """Load a `snapshot` into the server(s); later `generate` calls sample it (the engine is no longer stale)."""
        t0 = time.perf_counter()
        self.driver.push_encoded(parts, self.tied)
        self.stale = False
        self.syncs += 1
        self.last_sync_s = time.perf_counter() - t0

    def push_adapter(self) -> None:
        """vllm_lora_sync=adapter: the frozen base weights (unmerged) when this model's are not in vLLM yet, then the
        adapter, written in peft's format to a temporary directory (in memory on Linux: /dev/shm) that vLLM loads."""
        if self.base_pushed is not self.model:
            with torch.no_grad():
                self.driver.load_weights(hf_weights(self.model, self.options.dtype), self.tied)
            self.base_pushed = self.model
        if self.adapter_dir is None:
            self.adapter_dir = tempfile.TemporaryDirectory(
                prefix="lmrl-lora-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
            )
        self.model.save_pretrained(self.adapter_dir.name)
        self.driver.load_adapter(self.adapter_dir.name)

    # -- sampling --------------------------------------------------------------------------------------------

    @property
    def pad_token_id(self) -> int:
        return pad_token_id(self.tokenizer)

    def stop_token_ids(self, params: SamplingParams) -> tuple[int, ...]:
        return stop_token_ids(self.tokenizer, params, self.model)

    def generate_text(
        self, prompts: list[str], params: SamplingParams, n: int = 1, generator: torch.Generator | None = None
    ) -> RolloutBatch:
        """`generate` on already-rendered prompt strings (tokenized with add_special_tokens=False)."""
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise ValueError("VLLMEngine.generate_text takes a list of prompt strings; wrap a single prompt in a list.")
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        return self._generate(ids, params, n, generator, list(prompts))

    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        n: int = 1,
        generator: torch.Generator | None = None,
        record_linear_outputs: bool = False,
    ) -> RolloutBatch:
        """Sample n completions for each prompt (token ids, unpadded); rows are prompt-major (N = len * n).

        Deterministic given `generator` (one seed per prompt is drawn from it). record_linear_outputs is accepted for
        `HFEngine` compatibility and ignored: vLLM's forwards are not the learner's, so there is nothing to reuse."""
        prompt_ids = [p.tolist() if isinstance(p, torch.Tensor) else list(p) for p in prompt_ids]
        return self._generate(prompt_ids, params, n, generator, None)

    def _generate(self, prompt_ids, params, n, generator, prompt_texts) -> RolloutBatch:
        self._check_inputs(prompt_ids, params, n)
        if self.stale:
            self.sync_weights()
        if self.sleeping:
            self.driver.wake_up(["kv_cache"])
            self.sleeping = False
        seeds = torch.randint(
            0,
            SEED_RANGE,
            (len(prompt_ids),),
            generator=generator,
            device=generator.device if generator is not None else "cpu",
        ).tolist()
        tokens, logps, stopped = self.driver.sample(
            prompt_ids,
            n,
            0.0 if params.greedy else params.temperature,
            params.max_new_tokens,
            list(self.stop_token_ids(params)),
            seeds,
        )
        if self.options.sleep:  # give the memory back to training until the next rollout (weights then re-pushed)
            self.driver.sleep()
            self.sleeping, self.stale = True, True
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
        texts = self.tokenizer.batch_decode(
            [row[:k] for row, k in zip(out_ids.tolist(), lengths.tolist())], skip_special_tokens=True
        )
        if matcher is not None:
            texts = [matcher.cut(t)[0] for t in texts]
        if prompt_texts is None:
            prompt_texts = self.tokenizer.batch_decode(prompt_ids, skip_special_tokens=False)
        ids, mask = _left_pad(prompt_ids, pad, torch.device("cpu"))  # (B, P)
        truncated = ~stopped_t
        return RolloutBatch(
            prompt_ids=ids.repeat_interleave(n, dim=0).to(self.device),
            prompt_mask=mask.repeat_interleave(n, dim=0).to(self.device),
            completion_ids=out_ids.to(self.device),
            completion_mask=completion_mask.to(self.device),
            sampler_logp=out_logp.to(self.device),
            truncated=truncated.to(self.device),
            finish_reason=["length" if t else "stop" for t in truncated.tolist()],
            prompts=[text for text in prompt_texts for _ in range(n)],
            completions=texts,
            group_size=n,
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
                "model's max_position_embeddings) or shorten the prompts / max_new_tokens."
            )


def check_exact_logprobs(params: SamplingParams) -> None:
    """vLLM returns log_softmax(logits / T) of the sampled token (lmrl's `sampler_logp`) only without top-k/top-p
    truncation; with it, its log-probs are those of the truncated distribution. Refuse what would differ."""
    if not params.greedy and (params.top_k > 0 or params.top_p < 1):
        raise ValueError(
            f"engine=vllm samples with top_k=0 and top_p=1 only (got top_k={params.top_k}, top_p={params.top_p}): "
            "with truncation vLLM's log-probs are not lmrl's sampler_logp (the full distribution's). Set top_k=0 "
            "top_p=1, or use engine=hf."
        )
    if params.greedy and params.logp_temperature != 1.0:
        raise ValueError(
            f"engine=vllm: greedy decoding stores temperature-1 log-probs; got temperature="
            f"{params.temperature}. Use temperature=0 (or 1) with greedy, or engine=hf."
        )


def apply_stop_strings(
    matcher: StopStringMatcher, out_ids: torch.Tensor, lengths: torch.Tensor, stopped: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
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
