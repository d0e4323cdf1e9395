"""The vLLM rollout engine: vLLM samples with the training model's current weights, pushed into the running engine
in place after every optimizer step (never by a restart or through files). Where vLLM runs is the driver's business:
in this process (`VLLMDriver`, colocated) or in a `lmrl vllm-serve` process (`RemoteVLLM`, server mode).

    engine = VLLMEngine(model, tokenizer, VLLMOptions(max_model_len=256))
    engine.sync(model, version)             # before each rollout: a new version is pushed at the next generate
    batch = engine.generate(prompt_ids, SamplingParams(max_new_tokens=32, temperature=0.7), n=8, generator=g)

- Start: vLLM starts on the model's config with dummy weights and no tokenizer (`driver`; lmrl tokenizes and
  decodes, exactly as for the HF engine); the first `generate` pushes the real weights.
- Sync: the trainer calls `sync(model, version)` before it samples (`lmrl.rollout.protocol`); a new version (or a
  replaced model: rejection rounds) marks the engine stale, and the next `generate` pushes every weight in place
  (`weights`: merged LoRA, the tied-head re-pack on CPU) and resets the prefix cache (no KV from old weights is
  reused). With `VLLMOptions.lora_rank` (vllm_lora_sync=adapter) the frozen base goes once per model and each sync
  writes only the LoRA adapter, which vLLM serves (`push_adapter`).
- The same `RolloutBatch` as `HFEngine`: prompt-major rows (one request per prompt, `n` children sharing the
  prompt's KV through prefix caching), `sampler_logp` = log_softmax(logits / T) of each sampled token (vLLM's
  `processed_logprobs`; exact for top_k=0, top_p=1, which is why other settings are refused), stop token ids kept,
  stop strings replayed afterwards with HFEngine's check (`lmrl.rollout.engines.stop_strings`; rows do not end early
  inside vLLM), the batch laid out by the same `lmrl.rollout.engines.assemble`.
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

from lmrl.models.replay import SamplingRecorder
from lmrl.rollout.engines.assemble import assemble_batch, check_request, pad_token_id, stop_token_ids
from lmrl.rollout.engines.stop_strings import StopStringMatcher, apply_stop_strings
from lmrl.rollout.engines.vllm.driver import VLLMOptions
from lmrl.rollout.engines.vllm.weights import architecture, hf_weights, is_peft_model, merged_adapters
from lmrl.rollout.types import RolloutBatch, SamplingParams

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
        (`lmrl.rollout.engines.vllm.client`) is a `lmrl vllm-serve` process (server mode). Both sample identically."""
        self.model, self.tokenizer, self.options = model, tokenizer, options
        self.device = next(model.parameters()).device
        self.tied = bool(getattr(base_model(model).config, "tie_word_embeddings", False))
        if driver is None:
            from lmrl.rollout.engines.vllm.driver import VLLMDriver

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

    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        n: int = 1,
        generator: torch.Generator | None = None,
        recorder: SamplingRecorder | None = None,
    ) -> RolloutBatch:
        """Sample n completions for each prompt (token ids, unpadded); rows are prompt-major (N = len * n).

        Deterministic given `generator` (one seed per prompt is drawn from it). vLLM's forwards are not the
        learner's, so it records nothing: a ``recorder`` is refused (`ForwardPlan.resolve` gives none for engine=vllm)."""
        if recorder is not None:
            raise ValueError("VLLMEngine.generate: vLLM keeps no layer outputs to replay; sample without a recorder.")
        prompt_ids = [p.tolist() if isinstance(p, torch.Tensor) else list(p) for p in prompt_ids]
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
            list(stop_token_ids(self.tokenizer, params, self.model)),
            seeds,
        )
        if self.options.sleep:  # give the memory back to training until the next rollout (weights then re-pushed)
            self.driver.sleep()
            self.sleeping, self.stale = True, True
        return self._assemble(prompt_ids, tokens, logps, stopped, params, n)

    def _assemble(self, prompt_ids, tokens, logps, stopped, params, n) -> RolloutBatch:
        """vLLM's token lists as the `RolloutBatch` `HFEngine` returns (stop strings replayed on the finished rows)."""
        width = max(len(row) for row in tokens)
        out_ids = torch.full((len(tokens), width), self.pad_token_id, dtype=torch.long)  # (N, T)
        out_logp = torch.zeros(len(tokens), width, dtype=torch.float32)  # (N, T)
        for i, (ids, lps) in enumerate(zip(tokens, logps)):
            out_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            out_logp[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
        lengths = torch.tensor([len(row) for row in tokens])  # (N,)
        stopped = torch.tensor(stopped, dtype=torch.bool)  # (N,)
        matcher = self._matcher(params.stop_strings) if params.stop_strings else None
        if matcher is not None:
            lengths, stopped = apply_stop_strings(matcher, out_ids, lengths, stopped)
        return assemble_batch(
            self.tokenizer, prompt_ids, None, out_ids, out_logp, lengths, ~stopped, n, matcher, self.device
        )

    def _matcher(self, stop_strings: tuple[str, ...]) -> StopStringMatcher:
        if stop_strings not in self._matchers:
            vocab = base_model(self.model).get_output_embeddings().weight.shape[0]
            self._matchers[stop_strings] = StopStringMatcher(self.tokenizer, stop_strings, vocab, torch.device("cpu"))
        return self._matchers[stop_strings]

    def _check_inputs(self, prompt_ids, params: SamplingParams, n: int) -> None:
        check_request("VLLMEngine", prompt_ids, params, n, base_model(self.model).get_input_embeddings().num_embeddings)
        check_exact_logprobs(params)
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
