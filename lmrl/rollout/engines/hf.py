"""The default rollout engine: batched sampling from any HF causal LM with a KV cache.

Per unique prompt the prompt is run through the model ONCE (prefill on B rows), then the cache and the
last logits are repeated to B*n rows. Every new token costs one batched forward of shape (rows, 1); per-step
work is tensor ops over the batch, never a Python loop over rows (stop strings decode only the tail of the
few rows whose new token could complete one). Finished rows are masked; optionally, once enough rows have
finished, the batch is compacted to the running rows (`compact_threshold`).

    engine = HFEngine(model, tokenizer, autocast_dtype=torch.bfloat16)
    batch = engine.generate_text(["2+2="], SamplingParams(max_new_tokens=8, temperature=0.7), n=4)
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from lmrl.models import attention, packed, usage
from lmrl.models.hf_compat import accepts_kwarg, cache_kwarg, output_cache
from lmrl.models.modes import evaluating
from lmrl.models.replay import SamplingRecorder
from lmrl.models.usage import counting
from lmrl.rollout.engines import kv_cache
from lmrl.rollout.engines.assemble import assemble_batch, check_request, left_pad, pad_token_id, stop_token_ids
from lmrl.rollout.engines.sampling import sample_next_token
from lmrl.rollout.engines.stop_strings import StopStringMatcher
from lmrl.rollout.types import RolloutBatch, SamplingParams

__all__ = ["HFEngine", "SamplingParams"]


class HFEngine:
    """Batched KV-cache sampling from an HF causal LM; returns a `RolloutBatch`.

    model: any HF causal LM taking input_ids, attention_mask, position_ids, use_cache and a KV cache (`cache`, or
    `past_key_values` before transformers 5.2x).
    tokenizer: its tokenizer (pad id, eos id, decoding). autocast_dtype: e.g. torch.bfloat16 to run the
    forwards under autocast, None for the model's own dtype. compact_threshold: when at least this fraction
    of the running rows has finished, drop the finished rows from the batch and the cache (None: never).
    pack_weights: on a CPU under bf16 autocast, multiply by weights packed once per rollout for oneDNN
    (`lmrl.models.packed`: bitwise the same outputs); `metrics()` counts the packed forwards since it was last read.
    """

    def __init__(
        self,
        model,
        tokenizer,
        autocast_dtype: torch.dtype | None = None,
        compact_threshold: float | None = 0.5,
        pack_weights: bool = True,
    ):
        if compact_threshold is not None and not 0 < compact_threshold <= 1:
            raise ValueError(f"HFEngine.compact_threshold must be in (0, 1] or None, got {compact_threshold!r}.")
        self.model = model
        self.tokenizer = tokenizer
        self.autocast_dtype = autocast_dtype
        self.compact_threshold = compact_threshold
        self.pack_weights = pack_weights
        self._packed_calls: int | None = None  # packed linear forwards since metrics() was last read
        self._matchers: dict[tuple[str, ...], StopStringMatcher] = {}
        self._keeps_logits = accepts_kwarg(model, "logits_to_keep")
        self._cache_kwarg = cache_kwarg(model) or "past_key_values"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync(self, model, version: int) -> None:
        """Sample from `model` (`lmrl.rollout.protocol`): it samples the training model itself, so no weights move;
        a replaced model (the next rejection round's policy) is followed."""
        if model is not self.model:
            self.model = model
            self._keeps_logits = accepts_kwarg(model, "logits_to_keep")
            self._cache_kwarg = cache_kwarg(model) or "past_key_values"

    def metrics(self) -> dict[str, float]:
        if self._packed_calls is None:
            return {}
        calls, self._packed_calls = self._packed_calls, 0
        return {"rollout/packed_linear_calls": calls}

    def close(self) -> None:
        pass

    @property
    def pad_token_id(self) -> int:
        return pad_token_id(self.tokenizer)

    def generate_text(
        self, prompts: list[str], params: SamplingParams, n: int = 1, generator: torch.Generator | None = None
    ) -> RolloutBatch:
        """`generate` on already-rendered prompt strings (tokenized with add_special_tokens=False)."""
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise ValueError("HFEngine.generate_text takes a list of prompt strings; wrap a single prompt in a list.")
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        return self._generate(ids, params, n, generator, prompt_texts=list(prompts))

    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        n: int = 1,
        generator: torch.Generator | None = None,
        recorder: SamplingRecorder | None = None,
    ) -> RolloutBatch:
        """Sample n completions for each prompt (token ids, unpadded); rows are prompt-major (N = len * n).

        Deterministic given `generator` (None uses the global RNG); a generator on another device than the model's
        (a CPU one for a GPU model) seeds one on the model's device.
        recorder: keep every nn.Linear output of the sampling forwards in `batch.linear_outputs`, for an on-policy
        update to reuse (`lmrl.models.replay`; the recorder records nothing for a model with dropout).
        """
        return self._generate(prompt_ids, params, n, generator, prompt_texts=None, recorder=recorder)

    # -- internals -----------------------------------------------------------------------------------------

    def _generate(self, prompt_ids, params, n, generator, prompt_texts, recorder=None) -> RolloutBatch:
        if isinstance(prompt_ids, (list, tuple)):
            prompt_ids = [p.tolist() if isinstance(p, torch.Tensor) else p for p in prompt_ids]
        self._check_inputs(prompt_ids, params, n, generator)
        generator = on_device(generator, self.device)
        device, pad = self.device, self.pad_token_id
        ids, mask = left_pad(prompt_ids, pad, device)  # (B, P) each
        stop_ids = torch.tensor(stop_token_ids(self.tokenizer, params, self.model), dtype=torch.long, device=device)
        matcher = self._matcher(params.stop_strings) if params.stop_strings else None
        if recorder is not None:
            recorder = recorder.start(self.model, rows=len(prompt_ids) * n, steps=params.max_new_tokens)
        packs = self.pack_weights and self.autocast_dtype == torch.bfloat16 and device.type == "cpu"
        used = usage.Usage()
        try:  # eval mode while sampling; afterwards every module's own mode (a peft wrapper's root flag is not it)
            with (
                evaluating(self.model),
                self._grad_mode(recording=recorder is not None),
                self._autocast(),
                counting(used),
            ):
                with packed.packed_linears(self.model, torch.bfloat16 if packs else None, rows=len(prompt_ids) * n):
                    out_ids, out_logp, finish_step, steps = self._decode(
                        ids, mask, params, n, generator, stop_ids, matcher, recorder
                    )
        finally:
            if packs:
                self._packed_calls = (self._packed_calls or 0) + used["packed_linear_calls"]
            if recorder is not None:
                recorder.close()
        # Clone out of inference mode so that learners can use the tensors in autograd graphs.
        out_ids, out_logp, finish_step = out_ids.clone(), out_logp.clone(), finish_step.clone()
        lengths = torch.where(finish_step >= 0, finish_step + 1, steps)  # (N,)
        batch = assemble_batch(
            self.tokenizer, prompt_ids, prompt_texts, out_ids, out_logp, lengths, finish_step < 0, n, matcher, device
        )
        if recorder is None:
            return batch
        return dataclasses.replace(batch, linear_outputs=recorder.finish(steps, group_size=n))

    def _decode(self, ids, mask, params, n, generator, stop_ids, matcher, recorder=None):
        """The sampling loop. Returns completion ids (N, T), logps (N, T), finish step (N,) (-1: none), steps run."""
        model, pad = self.model, self.pad_token_id
        b, p = ids.shape
        rows_total = b * n
        max_new = params.max_new_tokens
        sample_kw = dict(
            temperature=params.logp_temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            greedy=params.greedy,
            generator=generator,
        )
        # Prefill once per unique prompt, then repeat the cache and the last logits n times (prompt-major).
        position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # (B, P)
        extra = {"logits_to_keep": 1} if self._keeps_logits else {}
        cache = kv_cache.preallocated_cache(model, capacity=p + max_new, dtype=self._cache_dtype())
        if cache is not None:
            extra[self._cache_kwarg] = cache
        with recorder.prefill() if recorder is not None else contextlib.nullcontext():
            out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True, **extra)
        logits = out.logits[:, -1]  # (B, V)
        cache = kv_cache.repeat_cache(output_cache(out), n)
        logits = logits.repeat_interleave(n, dim=0)  # (N, V)
        prompt_len = mask.sum(-1).repeat_interleave(n)  # (N,) real prompt tokens = position of completion token 0
        attn = torch.ones(rows_total, p + max_new, dtype=mask.dtype, device=mask.device)  # (N, P + max_new)
        attn[:, :p] = mask.repeat_interleave(n, dim=0)

        out_ids = torch.full((rows_total, max_new), pad, dtype=torch.long, device=ids.device)  # (N, max_new)
        out_logp = torch.zeros(rows_total, max_new, dtype=torch.float32, device=ids.device)  # (N, max_new)
        finish_step = torch.full((rows_total,), -1, dtype=torch.long, device=ids.device)  # (N,)
        rows = None  # original row of each active row once compacted; None = all rows, in order
        done = torch.zeros(rows_total, dtype=torch.bool, device=ids.device)  # (active,)
        can_compact = self.compact_threshold is not None and hasattr(cache, "batch_select_indices")
        step = 0
        for step in range(max_new):
            tokens, logp = sample_next_token(logits, **sample_kw)  # (active,) each
            tokens = tokens.masked_fill(done, pad)
            logp = logp.masked_fill(done, 0.0)
            stopped = torch.isin(tokens, stop_ids) & ~done  # (active,)
            if rows is None:
                out_ids[:, step], out_logp[:, step] = tokens, logp
            else:
                out_ids[rows, step], out_logp[rows, step] = tokens, logp
            if matcher is not None:
                lo = max(0, step + 1 - matcher.window)  # only the tail can hold a new stop string
                tail = out_ids[:, lo : step + 1]  # (N, <= window)
                history = tail if rows is None else tail[rows]  # (active, <= window)
                stopped |= matcher(history, tokens, ~done & ~stopped)
            finish_step[stopped if rows is None else rows[stopped]] = step
            done |= stopped
            n_done, n_active = int(done.sum()), done.numel()
            if n_done == n_active or step == max_new - 1:
                break
            if can_compact and n_done > 0 and n_done >= self.compact_threshold * n_active:
                keep = (~done).nonzero().squeeze(1)  # (still running,)
                if recorder is not None:
                    finished = done.nonzero().squeeze(1)
                    recorder.drop(finished if rows is None else rows[finished], step)
                cache.batch_select_indices(keep)
                rows = keep if rows is None else rows[keep]
                tokens, attn, prompt_len, done = tokens[keep], attn[keep], prompt_len[keep], done[keep]
            pos = (prompt_len + step)[:, None]  # (active, 1): position of the token just sampled
            with recorder.decode(step, rows) if recorder is not None else contextlib.nullcontext():
                out = model(
                    input_ids=tokens[:, None],
                    attention_mask=attn[:, : p + step + 1],
                    position_ids=pos,
                    use_cache=True,
                    **{self._cache_kwarg: cache},
                )
            cache = output_cache(out)
            logits = out.logits[:, -1]  # (active, V)
        steps = step + 1
        return out_ids[:, :steps], out_logp[:, :steps], finish_step, steps

    def _matcher(self, stop_strings: tuple[str, ...]) -> StopStringMatcher:
        if stop_strings not in self._matchers:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            self._matchers[stop_strings] = StopStringMatcher(self.tokenizer, stop_strings, vocab, self.device)
        return self._matchers[stop_strings]

    def _cache_dtype(self) -> torch.dtype | None:
        """fp32 where the attention reads fp32 keys and values (``lmrl_sdpa``: CPU under autocast), so that a bf16
        cache is not re-cast whole at every decode step; else None (the keys' and values' own dtype)."""
        fp32_attention = getattr(getattr(self.model, "config", None), "_attn_implementation", None) == attention.NAME
        return (
            torch.float32 if fp32_attention and self.autocast_dtype is not None and self.device.type == "cpu" else None
        )

    def _grad_mode(self, recording: bool = False) -> contextlib.AbstractContextManager:
        """inference_mode, except under autocast: autocast does not cache its weight casts inside inference_mode
        (every forward would re-cast every weight), but does under no_grad (one cast per weight per rollout); and
        except when recording linear outputs, which a learner's autograd graph will hold."""
        return torch.inference_mode() if self.autocast_dtype is None and not recording else torch.no_grad()

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _check_inputs(self, prompt_ids, params, n, generator) -> None:
        check_request("HFEngine", prompt_ids, params, n, self.model.get_input_embeddings().num_embeddings)
        longest = max(len(p) for p in prompt_ids)
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        if limit is not None and longest + params.max_new_tokens > limit:
            raise ValueError(
                f"HFEngine.generate: the longest prompt ({longest} tokens) plus max_new_tokens={params.max_new_tokens} "
                f"exceeds the model's max_position_embeddings={limit}; shorten the prompts or lower max_new_tokens."
            )


def on_device(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """`generator` if it is on `device` (or None), else a generator on `device` seeded with a draw from it: the
    sampling ops need one on the logits' device, and the callers seed theirs on the CPU."""
    if generator is None or generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2**62, (), generator=generator))
    return torch.Generator(device).manual_seed(seed)
