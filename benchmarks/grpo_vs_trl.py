"""GRPO throughput and memory: lmrl's online trainer vs TRL's GRPOTrainer, same model, data and settings.

    python benchmarks/grpo_vs_trl.py                                   # builtin:medium (~14M), 8x8x32, 12 steps, bf16
    python benchmarks/grpo_vs_trl.py --precision fp32 --steps 20 --warmup 4
    python benchmarks/grpo_vs_trl.py --trl-gradient-checkpointing      # TRL's own default (recomputes activations)
    python benchmarks/grpo_vs_trl.py --qwen2-vocab 151936 --prompts 16 --samples 8 --max-new-tokens 256 \
        --trl-micro-batch 8 --lmrl-set gradient_checkpointing=true    # Qwen2 architecture, Qwen2.5's vocabulary size
    python benchmarks/grpo_vs_trl.py --model path/to/SmolLM2-135M-Instruct.Q4_1.gguf --prompts 8 --samples 4 \
        --max-new-tokens 64 --trl-gradient-checkpointing --rounds 5   # a real instruct model (`make smollm2`)
    python benchmarks/grpo_vs_trl.py --gpt2 --hidden 128 --layers 4 --prompts 16 --samples 8 \
        --trl-gradient-checkpointing --rounds 5                        # a tiny GPT-2 (builtin:bpe tokenizer)

(docs/benchmarks.md, "Real models", has the exact commands with their step counts.)

``--model`` is a built-in model (random init, seed 0), an HF model folder or a GGUF file: the parent loads it with
lmrl's loader (a GGUF de-quantized to fp32 by ``lmrl.models.gguf``) and its own tokenizer and chat template, and
saves both as a plain HF folder that the two frameworks load. Prompts follow the model: a folder or GGUF file (an
instruct model) gets chat questions (``task_args.style=chat``: "What is 12+34? Answer with the number only.",
scored on the last number of the reply), a built-in model the plain ``12+34=`` (``--task-style`` overrides).
``--gpt2`` builds a GPT-2 locally (``transformers.GPT2Config``, random init, seed 0; ``--hidden``, ``--layers``,
heads of 32 dimensions) with the ``builtin:bpe`` tokenizer (1,024 ids, ChatML).

``--qwen2-vocab V`` builds a Qwen2-architecture model locally (random init, seed 0; ``--hidden``, ``--layers``) whose
vocabulary has V entries, with the ``builtin:char`` tokenizer extended by added tokens ``<x0>``, ``<x1>``, ... to V
entries (so every sampled id has text, and the digit reward varies): what costs memory in a big-vocabulary model is
the LM head and its logits, which this reproduces at a size that runs on a CPU.

The parent process builds or loads the model once (``build_model``) and saves it with its tokenizer to a temporary
directory, writes the prompt rows (built-in arithmetic task, train split) to a JSONL file, then runs each framework in its own subprocess, one after the other, so that each one's peak
memory is its own. Both load the saved directory in fp32 (master weights) and train with:

- B prompts x G samples per prompt = B*G completions per optimizer step, one optimizer step per generation batch
  (lmrl ``ppo_epochs=1 minibatches=1 grad_accum=1``; TRL ``per_device_train_batch_size=B*G``, ``num_generations=G``,
  ``gradient_accumulation_steps=1`` so ``steps_per_generation=1``, ``num_iterations=1``);
- sampling at temperature 1.0, no top-k/top-p, at most ``--max-new-tokens`` completion tokens, stop at ``<|im_end|>``;
- reward (``--reward``): the share of digits in the completion, a pseudo-random number fixed by its text
  (``text_hash``), or the task's own verifier (``get_task(row["task"]).score``); group-std-scaled GRPO advantages;
- PPO-clip loss with eps 0.2, token-mean aggregation (TRL ``loss_type="dapo"``), no KL (``kl_coef=0``/``beta=0``, so
  neither builds a reference model), no importance-sampling correction (lmrl ``tis_cap=null``; TRL has none without
  vLLM);
- AdamW lr 1e-5, betas (0.9, 0.99), no weight decay, constant schedule, no warmup, grad-norm clip 1.0;
- bf16 autocast (``--precision bf16``; lmrl ``precision=bf16``, TRL ``bf16=True use_cpu=True``) or fp32;
- no evaluation, no checkpoints during the steps; metrics logged every step (lmrl ``log_every=1``, TRL
  ``logging_steps=1``, ``report_to="none"``).

What is timed, identically for both: a timestamp (``time.perf_counter``) when each optimizer step has finished (lmrl:
when ``rl_step`` returns, i.e. after rollout, scoring, update and optimizer step; TRL: the ``on_step_end`` callback,
right after its optimizer step). A step's time is the wall time between consecutive step ends, so it includes
everything the framework does per step (generation, rewards, forward/backward, optimizer, its per-step logging).
Steady state drops the first ``--warmup`` steps: steps/s = (steps - warmup) / (end of last step - end of step
``warmup``). Completion tokens/s counts the sampled tokens of those steps (up to and including the stop token).
Peak memory: the process's peak RSS (``VmHWM``; for lmrl the largest of its phase peaks, below) at the end of the last
training step, and that peak minus the RSS just before the model is loaded (after every import); the peak at process
exit (final save included) is printed too.
Generation time per step: lmrl's ``time/rollout_s``; TRL's ``_generate_single_turn`` (wrapped with a timer).
``--rounds N`` alternates the frameworks N times and reports, for each, the round of median steps/s, and the median
of the per-round lmrl/TRL ratios; the run ends with one markdown row per framework to paste.

The lmrl child also prints a model of its peak memory (``MemoryModel``): each phase's own peak RSS (the kernel's
``VmHWM``, reset through ``/proc/self/clear_refs`` at each phase boundary), next to what each part of the step holds,
in MiB: fp32 weights, gradients, AdamW's two moments, the sampler's recorded layer outputs, the rollout's KV cache,
the autocast cache of bf16 weight copies, the tensors the training forward saves for the backward (unique storages,
from ``torch.autograd.graph.saved_tensors_hooks``), the LM-head logits, the free memory glibc's malloc holds, and the
RSS before loading; their sums against the measured peaks; and the fresh pages (minor faults) of each phase.

This is a benchmark, not a test: results depend on the machine and its load (the load average is printed).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FRAMEWORKS = ("lmrl", "trl")
LR = 1e-5
ADAM_BETAS = (0.9, 0.99)
MAX_GRAD_NORM = 1.0


# ----------------------------------------------------------------------------- measurement helpers


def _status_mb(key: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in MB; ru_maxrss where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB -> MB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    return _status_mb("VmHWM")


def digit_share(completion: str) -> float:
    """The dense benchmark reward: the share of digit characters in a completion (0 for an empty one)."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def text_hash(completion: str) -> float:
    """A pseudo-random reward in [0, 1) fixed by a completion's text (blake2b): the same text scores the same in
    both frameworks and in every run, and a random model's completions (all different) get different rewards, so
    every group's advantages are non-zero whatever the model writes."""
    digest = hashlib.blake2b(completion.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


DENSE_REWARDS = {"digits": digit_share, "hash": text_hash}
"""--reward choices scored per completion text by one function, the same in both frameworks."""


class DtypeProbe:
    """The most common output dtype of the first ``CALLS`` linear-layer calls (nn.Linear, GPT-2's Conv1D) with grad
    off (generation) and on (training): the compute dtype, whatever a few fp32 calls (a start-up check of the LM head)
    say. A global module forward hook that removes itself once both phases are counted, so it costs the first step.
    """

    CALLS = 500

    def __init__(self) -> None:
        import torch

        self.counts: dict[str, collections.Counter] = {
            "generate": collections.Counter(),
            "train": collections.Counter(),
        }
        self._torch = torch
        self._handle = torch.nn.modules.module.register_module_forward_hook(self)

    def __call__(self, module, inputs, output) -> None:
        torch = self._torch
        if (isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D") and isinstance(
            output, torch.Tensor
        ):
            counts = self.counts["train" if torch.is_grad_enabled() else "generate"]
            if sum(counts.values()) < self.CALLS:
                counts[str(output.dtype).removeprefix("torch.")] += 1
            elif all(sum(c.values()) >= self.CALLS for c in self.counts.values()):
                self._handle.remove()

    def reset(self) -> None:
        for counts in self.counts.values():
            counts.clear()

    @property
    def seen(self) -> dict[str, str]:
        return {phase: c.most_common(1)[0][0] for phase, c in self.counts.items() if c}


def gpu_peak_mb() -> float | None:
    """MiB of the largest GPU allocation so far (`torch.cuda.max_memory_allocated`; the caching allocator's own
    reserve not counted), None without CUDA."""
    import torch

    return (
        torch.cuda.max_memory_allocated() / MIB if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    )


def steady_state(step_ends: list[float], tokens: list[float], warmup: int) -> dict[str, float]:
    """steps/s and completion tokens/s over steps warmup+1..S: (S - warmup) / (end_S - end_warmup); warmup=0: a
    memory-only run (no rate: NaN)."""
    if warmup == 0:
        return {"steps_per_s": float("nan"), "s_per_step": float("nan"), "tokens_per_s": float("nan")}
    if len(step_ends) <= warmup or warmup < 1:
        raise ValueError(f"need more than warmup={warmup} >= 1 step ends, got {len(step_ends)}")
    seconds = step_ends[-1] - step_ends[warmup - 1]
    steps = len(step_ends) - warmup
    return {
        "steps_per_s": steps / seconds,
        "s_per_step": seconds / steps,
        "tokens_per_s": sum(tokens[warmup:]) / seconds,
    }


# ----------------------------------------------------------------------------- lmrl's memory model

MIB = 2**20


def storage_mib(tensors) -> float:
    """MiB of the distinct storages under ``tensors`` (views of one buffer count once)."""
    sizes = {}
    for t in tensors:
        storage = t.untyped_storage()
        sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values()) / MIB


def reset_peak() -> bool:
    """Reset the kernel's peak RSS (VmHWM) to the current RSS (Linux: ``5`` into /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def malloc_free_mib() -> float:
    """MiB that glibc's malloc holds free and resident (no tensor's): anonymous RSS minus malloc's bytes in use
    (``mallinfo2().uordblks + hblkhd``) minus what was not malloc's before the model loaded (``NOT_MALLOC``).
    Not ``fordblks``, which also counts the free pages ``release_memory`` handed back. 0 where malloc is not
    glibc >= 2.33."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return 0.0
    mallinfo2.restype = Info
    info = mallinfo2()
    return max(0.0, _status_mb("RssAnon") - (info.uordblks + info.hblkhd) / MIB - NOT_MALLOC[0])


NOT_MALLOC = [0.0]
"""MiB of anonymous resident memory that is not malloc's (Python's object arenas, thread stacks): set before the
model loads (`malloc_free_mib`)."""


PEAK_MODELS = {  # the parts (name prefixes) whose sum models each measured peak of `MemoryModel`
    "rollout (step 1)": (
        "RSS before",
        "weights",
        "KV cache",
        "bf16 weight copies (sampling)",
        "recorded layer outputs (after",
    ),
    "rollout": ("RSS before", "weights", "AdamW"),  # every rollout's: after the first, AdamW's states exist (+ REUSED)
    "backward": (
        "RSS before",
        "weights",
        "AdamW",
        "gradients",
        "LM head",
        "largest training forward",
    ),
}

REUSED = {  # peak -> (malloc's free memory at its start, the parts the phase allocates into it first)
    "rollout": (
        "malloc free memory at the start of a rollout",
        ("KV cache", "bf16 weight copies (sampling)", "recorded layer outputs (after"),
    ),
}
"""These peaks add max(free, allocations) to their sum: the phase's own allocations go into the free heap first."""


class MemoryModel:
    """lmrl's peak RSS by phase of a step, next to the size of each part the step holds (MiB, largest over steps).

    Read-only wrappers mark the phases: ``rollout`` (sampling), ``score`` (rewards, advantages), ``forward`` (the
    training forward, under ``saved_tensors_hooks``), ``backward`` (loss and backward), ``optimizer`` (clip, AdamW),
    ``log`` (the step's metrics), ``after step`` (the training loop's own work; after the last step: the final save);
    ``load`` is everything before the first rollout. A phase's peak is VmHWM at its end, reset at its start,
    so the process's peak is the largest phase peak. Parts: fp32 weights and gradients (4 bytes per parameter each),
    AdamW (exp_avg and exp_avg_sq: 8 bytes per parameter), the sampler's recorded layer outputs
    (``RolloutBatch.linear_outputs``; what of it the training forward leaves is held through the backward), the KV
    cache (after repeating the prompts' cache to the B*G rows), the autocast cache (a bf16 copy of every linear
    layer's weight, kept while sampling: 2 bytes per parameter), the training forward's saved tensors by kind
    (activations; bf16 weight copies; fp32 weights, already counted), the LM head's fp32 logits when the chunked head
    runs (``logprob_chunk_mb``; otherwise they are among the saved tensors), and the memory glibc's malloc holds free
    (resident, reusable, but no tensor's) when the training forward ends.

    Two sums model the two peaks: the first rollout's (before any gradient or AdamW state exists) and the training
    step's, at the start of the backward (everything the forward saved, plus the gradients, which the backward
    allocates while it frees the activations: an upper bound); with several micro-batches (``grad_accum``) the
    forward whose saved tensors, held record and malloc free memory add up to the most. malloc's free memory is
    what of ``mallinfo2().fordblks`` is still resident (`malloc_free_mib`: ``release_memory`` hands free pages back).
    A third sum models every rollout's peak: after the first, AdamW's states exist and malloc holds what training
    left free, which the rollout's KV cache, bf16 weight copies and record fill first (`REUSED`).
    """

    def __init__(self, model_dtype: str):
        import torch

        from lmrl.models.forward_plan import ForwardPlan
        from lmrl.rollout.engines import kv_cache
        from lmrl.rollout.samplers.groups import LocalGroups
        from lmrl.trainers import common

        self.bf16 = model_dtype == "bf16"
        self.peaks: dict[str, float] = {}
        self.parts: dict[str, float] = {}
        self.phase, self.rollouts = "load", 0
        self.faults: dict[str, int] = {}  # minor page faults by phase, all steps
        self.step_peaks: list[float] = []  # the largest phase peak of each step
        self.last_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.resets = reset_peak()
        rollout, logprobs, step, repeat = (
            LocalGroups.sample,
            ForwardPlan.logprobs,
            common.optimizer_step,
            kv_cache.repeat_cache,
        )

        def timed_rollout(*a, **kw):
            self.mark("rollout")
            self.step_peaks.append(0.0)
            self.rollouts += 1
            self.record("malloc free memory at the start of a rollout", malloc_free_mib())  # what training left
            batch = rollout(*a, **kw)
            self.mark("score")
            self.record("recorded layer outputs (after sampling)", record_mib(batch.linear_outputs))
            return batch

        def measured_logprobs(plan, model, input_ids, attention_mask, completion_start, *a, **kw):
            if not torch.is_grad_enabled():
                return logprobs(plan, model, input_ids, attention_mask, completion_start, *a, **kw)
            self.see(model, plan.chunk_mb, input_ids.shape[0] * (input_ids.shape[1] - completion_start))
            self.mark("forward")
            with saved_tensor_sizes(model) as saved:  # lmrl's own hooks (`saving_less`) report what they keep
                out = logprobs(plan, model, input_ids, attention_mask, completion_start, *a, **kw)
            for kind, mib in saved.items():
                self.record(f"saved for backward: {kind}", mib)
            held, free = record_mib(kw.get("linear_outputs")), malloc_free_mib()
            self.record("recorded layer outputs, still held in the backward", held)
            self.record("malloc free memory at the end of the forward", free)
            kept = sum(mib for kind, mib in saved.items() if kind in ("activations", "bf16 weight copies"))
            self.record("largest training forward: saved + record held + malloc free", kept + held + free)
            self.mark("backward")
            return out

        def measured_step(params, optimizer, *a, **kw):
            params = list(params)
            self.record("gradients (fp32)", storage_mib([p.grad for p in params if p.grad is not None]))
            self.mark("optimizer")
            norm = step(params, optimizer, *a, **kw)
            self.mark("log")
            self.record(
                "AdamW exp_avg + exp_avg_sq (fp32)",
                storage_mib(
                    [
                        t
                        for state in optimizer.state.values()
                        for k, t in state.items()
                        if k in ("exp_avg", "exp_avg_sq")
                    ]
                ),
            )
            return norm

        def measured_repeat(cache, n):
            cache = repeat(cache, n)
            layers = getattr(cache, "layers", [])
            self.record(
                "KV cache (rollout)",
                storage_mib(
                    [getattr(layer, name) for layer in layers for name in ("_kbuf", "_vbuf") if hasattr(layer, name)]
                    or [t for layer in layers for t in (layer.keys, layer.values)]
                ),
            )
            return cache

        LocalGroups.sample, ForwardPlan.logprobs, common.optimizer_step = (
            timed_rollout,
            measured_logprobs,
            measured_step,
        )
        kv_cache.repeat_cache = measured_repeat

    def mark(self, next_phase: str) -> None:
        """End the current phase (its peak: VmHWM since its start) and start ``next_phase`` with a fresh peak."""
        phases = [self.phase] + (["rollout (step 1)"] if self.phase == "rollout" and self.rollouts == 1 else [])
        for phase in phases:
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), peak_rss_mb())
        if self.step_peaks and self.phase != "after step":  # a step: from its rollout to the end of rl_step
            self.step_peaks[-1] = max(self.step_peaks[-1], peak_rss_mb())
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.faults[self.phase] = self.faults.get(self.phase, 0) + faults - self.last_faults
        self.last_faults = faults
        reset_peak()
        self.phase = next_phase

    def record(self, part: str, mib: float) -> None:
        self.parts[part] = max(self.parts.get(part, 0.0), mib)

    def see(self, model, chunk_mb: float, positions: int) -> None:
        """The policy's parameter sizes, and the LM head's logits if the chunked head runs for ``positions``."""
        from lmrl.models.head import chunked_head
        from lmrl.models.replay import is_linear

        self.record("weights (fp32)", storage_mib(model.parameters()))
        if self.bf16:  # packed weights (lmrl.models.packed) or autocast's cache while sampling: one bf16 copy each
            linear = {id(m.weight): m.weight for m in model.modules() if is_linear(m)}
            self.record("bf16 weight copies (sampling)", sum(w.numel() for w in linear.values()) * 2 / MIB)
        if chunked_head(model, positions, chunk_mb) is not None:
            self.record("LM head logits chunk (logprob_chunk_mb)", chunk_mb)

    def table(self, baseline: float) -> list[str]:
        """The parts, the sums that model the first rollout's and the training step's peaks, and the peaks."""
        parts = {"RSS before loading (python, torch, imports)": baseline, **self.parts}
        lines = [f"  {name:52s} {mib:9.0f}" for name, mib in parts.items()]
        for phase, names in PEAK_MODELS.items():
            total = sum(mib for part, mib in parts.items() if part.startswith(names))
            if phase in REUSED:
                free, allocated = REUSED[phase]
                total += max(
                    parts.get(free, 0.0), sum(mib for part, mib in parts.items() if part.startswith(allocated))
                )
            measured = self.peaks.get(phase, float("nan"))
            lines.append(
                f"  {'model of the ' + phase + ' peak (sum)':52s} {total:9.0f}   measured {measured:6.0f} "
                f"({(total - measured) / measured:+.0%})"
            )
        lines.append("  phase peaks: " + ", ".join(f"{k} {v:.0f}" for k, v in self.peaks.items()))
        lines.append("  peak of each step: " + ", ".join(f"{v:.0f}" for v in self.step_peaks))
        steps = max(1, self.rollouts)
        lines.append(
            "  minor page faults per step (fresh 4 KiB pages, MiB): "
            + ", ".join(
                f"{k} {v * 4 / 1024 / steps:.0f}" for k, v in self.faults.items() if k not in ("load", "after step")
            )
        )
        return lines


def record_mib(record) -> float:
    """MiB of a `LinearOutputs` record's tensors (0 for None)."""
    return 0.0 if record is None else storage_mib([*record.prefill.values(), *record.decode.values()])


@contextlib.contextmanager
def saved_tensor_sizes(model):
    """Yields a dict filled at the block's end: MiB of the distinct storages autograd saved for the backward inside
    the block, by kind: the model's parameters, bf16 copies of its weights (a bf16 storage of a weight's shape), and
    activations (the rest). Inside lmrl's `saving_less` (the training forward) its own hooks report what they keep;
    the tensors they rebuild instead of keeping are not counted."""
    import torch

    from lmrl.models import forward_plan as logprobs_module
    from lmrl.models import rebuild

    params = list(model.parameters())
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    weight_shapes = {s for p in params if p.dim() == 2 for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    storages: dict[int, tuple[str, int]] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() in param_ptrs:
            kind = "fp32 weights (counted above)"
        elif t.dtype == torch.bfloat16 and tuple(t.shape) in weight_shapes:
            kind = "bf16 weight copies"
        else:
            kind = "activations"
        storages.setdefault(storage.data_ptr(), (kind, storage.nbytes()))
        return t

    sizes: dict[str, float] = {}
    plain = logprobs_module.saving_less
    logprobs_module.saving_less = functools.partial(rebuild.saving_less, observe=pack)  # the innermost hooks
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield sizes
    finally:
        logprobs_module.saving_less = plain
    for kind, nbytes in storages.values():
        sizes[kind] = sizes.get(kind, 0.0) + nbytes / MIB


# ----------------------------------------------------------------------------- setup (parent)


def build_model(args: argparse.Namespace):
    """The model (fp32) and tokenizer both frameworks train: built here (``--qwen2-vocab``, ``--gpt2``, a built-in
    model), or loaded with lmrl's loader (an HF folder, or a GGUF file de-quantized by ``lmrl.models.gguf``)."""
    import torch

    from lmrl.data.tokenizers import build_char_tokenizer, load_tokenizer
    from lmrl.models import is_builtin, load_model

    if args.qwen2_vocab:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        tokenizer = extended_char_tokenizer(args.qwen2_vocab)
        torch.manual_seed(0)
        return Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=args.qwen2_vocab,
                hidden_size=args.hidden,
                intermediate_size=4 * args.hidden,
                num_hidden_layers=args.layers,
                num_attention_heads=max(1, args.hidden // 64),
                num_key_value_heads=1,
                tie_word_embeddings=True,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id,
                max_position_embeddings=4096,
            )
        ), tokenizer
    if args.gpt2:
        from transformers import GPT2Config, GPT2LMHeadModel

        tokenizer = load_tokenizer("builtin:bpe")
        torch.manual_seed(0)
        return GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(tokenizer),
                n_embd=args.hidden,
                n_layer=args.layers,
                n_head=max(1, args.hidden // 32),
                n_positions=1024,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.eos_token_id,
            )
        ), tokenizer
    if is_builtin(args.model):
        tokenizer = build_char_tokenizer()
        return load_model(args.model, tokenizer, seed=0), tokenizer
    tokenizer = load_tokenizer(args.model)  # an HF folder or GGUF file: its own tokenizer and chat template
    return load_model(args.model, tokenizer), tokenizer


def extended_char_tokenizer(vocab: int):
    """The ``builtin:char`` tokenizer with added tokens ``<x0>``, ``<x1>``, ... up to ``vocab`` entries, so that every
    id a random model samples decodes to text."""
    from lmrl.data.tokenizers import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens([f"<x{i}>" for i in range(vocab - len(tokenizer))])
    return tokenizer


def task_style(args: argparse.Namespace) -> str:
    """--task-style auto: chat questions for a model folder or GGUF file (an instruct model), plain otherwise."""
    if args.task_style != "auto":
        return args.task_style
    from lmrl.models import is_builtin

    return "plain" if args.qwen2_vocab or args.gpt2 or is_builtin(args.model) else "chat"


def prepare(args: argparse.Namespace, workdir: Path, built: tuple | None = None) -> dict[str, Any]:
    """Save the shared model + tokenizer (a plain HF folder; ``built``: this (model, tokenizer) rather than
    `build_model`'s) and the prompt rows; check both frameworks' prompts tokenize the same."""
    from transformers.utils import logging as hf_logging

    from lmrl.data.chat import render_prompt
    from lmrl.data.tasks import get_task, make_rows
    from lmrl.models import count_parameters

    hf_logging.disable_progress_bar()
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF reader's own progress bars
    model_dir = workdir / "model"
    model, tokenizer = built or build_model(args)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    style = task_style(args)
    rows = make_rows(get_task("arithmetic", style=style), args.prompts * args.steps, split="train", seed=0)
    rows_path = workdir / "prompts.jsonl"
    rows_path.write_text(
        "".join(json.dumps({k: r[k] for k in ("prompt", "answer", "task", "meta")}) + "\n" for r in rows)
    )
    prompt_tokens = []
    for row in rows[:4]:
        ours = tokenizer(render_prompt(tokenizer, row["prompt"]), add_special_tokens=False)["input_ids"]
        theirs = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        if list(ours) != list(theirs):
            raise RuntimeError(f"prompt token ids differ between lmrl and the chat template: {ours} vs {theirs}")
        prompt_tokens.append(len(ours))
    return {
        "model_dir": str(model_dir),
        "rows": str(rows_path),
        "params_m": count_parameters(model) / 1e6,
        "name": model_name(args, model),
        "style": style,
        "prompt_tokens": prompt_tokens,
    }


def model_name(args: argparse.Namespace, model) -> str:
    if args.qwen2_vocab:
        return f"Qwen2 vocab {args.qwen2_vocab} hidden {args.hidden} x{args.layers}"
    if args.gpt2:
        return f"GPT-2 n_embd {args.hidden} x{args.layers} layers, vocab {model.config.vocab_size} (builtin:bpe)"
    return Path(args.model).name if Path(args.model).exists() else args.model


# ----------------------------------------------------------------------------- children


def lmrl_config(args: argparse.Namespace, workdir: Path, out: Path):
    """lmrl's `RLConfig` for the benchmark's settings (the module docstring), writing its run to ``out``."""
    from lmrl.config import load_config
    from lmrl.trainers.rl import trainer as online

    overrides = [
        f"model={workdir / 'model'}",
        f"dataset={workdir / 'prompts.jsonl'}",
        f"train_rows={args.prompts * args.steps}",
        "algorithm=grpo",
        f"prompts_per_step={args.prompts}",
        f"samples_per_prompt={args.samples}",
        f"max_new_tokens={args.max_new_tokens}",
        "temperature=1.0",
        "top_p=1.0",
        "top_k=0",
        "ppo_epochs=1",
        "minibatches=1",
        "grad_accum=1",
        "kl_coef=0",
        "tis_cap=null",
        "adv_scale=group",
        "clip_low=0.2",
        "clip_high=0.2",
        "loss_agg=token_mean",
        f"lr={LR}",
        f"adam_betas=[{ADAM_BETAS[0]},{ADAM_BETAS[1]}]",
        "weight_decay=0",
        "lr_schedule=constant",
        "warmup_steps=0",
        f"max_grad_norm={MAX_GRAD_NORM}",
        f"precision={args.precision}",
        f"device={args.device}",
        "seed=0",
        f"max_steps={args.steps}",
        "log_every=1",
        "eval_every=0",
        "save_every=0",
        f"sample_every={args.steps + 1}",
        f"output_dir={out}",
        "overwrite=true",
        *args.lmrl_set,
    ]
    if args.reward in DENSE_REWARDS:
        from lmrl.rewards import REWARDS, register_reward

        score = DENSE_REWARDS[args.reward]
        if score.__name__ not in REWARDS:
            register_reward(score.__name__)(
                lambda **_: lambda prompts, completions, **kw: [score(c) for c in completions]
            )
        overrides.append(f"rewards=[{score.__name__}]")
    return load_config(online.RLConfig, None, overrides)


def run_lmrl(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import torch

    from lmrl.tracking import read_jsonl
    from lmrl.trainers.rl import trainer as online

    out = workdir / "lmrl-run"
    config = lmrl_config(args, workdir, out)
    step_ends: list[float] = []
    peak_at_last_step: list[float] = []
    gpu_peak: list[float | None] = [None]
    original_step = online.rl_step
    NOT_MALLOC[0] = malloc_free_mib()  # NOT_MALLOC is 0 here: all of it
    memory = MemoryModel(args.precision)
    probe = DtypeProbe()

    def timed_step(*a, **kw):  # read-only wrapper: the step's end time and peak RSS so far
        if not step_ends:  # the steps' calls, not the start-up checks (`fuse_layers`, the LM head's split)
            probe.reset()
        metrics = original_step(*a, **kw)
        step_ends.append(time.perf_counter())
        memory.mark("after step")  # then the loop's own work: logging, checkpoints, and at the end the final save
        peak_at_last_step[:] = [max(memory.peaks.values())]
        gpu_peak[:] = [gpu_peak_mb()]
        return metrics

    online.rl_step = timed_step
    baseline = rss_mb()
    online.train(config)
    memory.mark("exit")
    print("lmrl memory model (MiB):", *memory.table(baseline), sep="\n", flush=True)
    records = [r for r in read_jsonl(out / "metrics.jsonl") if "reward/mean" in r]
    n = args.prompts * args.samples
    return {
        "step_ends": step_ends,
        "tokens": [r["completion_len/mean"] * n for r in records],
        "generate_s": [r["time/rollout_s"] for r in records],
        "rewards": [r["reward/mean"] for r in records],
        "losses": [r["loss"] for r in records],
        "skipped_rows": sum(r.get("update/skipped_rows_frac", 0.0) for r in records) / len(records),
        "baseline_mb": baseline,
        "peak_mb": peak_at_last_step[0],
        "exit_peak_mb": max(memory.peaks.values()),
        "dtypes": probe.seen,
        "threads": torch.get_num_threads(),
        "gpu_peak_mb": gpu_peak[0],
        "memory_model": memory.table(baseline),
        "resets_peak": memory.resets,
    }


def trl_setup(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """What `GRPOTrainer` gets besides its callbacks, for the benchmark's settings (the module docstring): ``args``
    (a `GRPOConfig`), ``train_dataset``, ``processing_class``, ``reward_funcs`` and ``model`` (the saved folder),
    and ``calls`` (the reward function's call count, not the trainer's)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from lmrl.data.tasks import get_task

    rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()]
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": r["prompt"]}],
                "answer": r["answer"],
                "task": r["task"],
                "meta": json.dumps(r["meta"]),
            }
            for r in rows
        ]
    )
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    calls = {"reward": 0}

    def task_reward(completions, answer, task, meta, **kwargs) -> list[float]:
        """The same verifier as lmrl's `task` reward: get_task(task).score(completion, answer, meta)."""
        calls["reward"] += 1
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [get_task(t).score(x, a, json.loads(m)) for x, a, t, m in zip(texts, answer, task, meta)]

    # the reward function must score a right answer 1 and a wrong one 0, or the comparison means nothing
    first = rows[0]
    check = task_reward(
        [[{"content": f"<answer>{first['answer']}</answer>"}], [{"content": "x"}]],
        [first["answer"]] * 2,
        [first["task"]] * 2,
        [json.dumps(first["meta"])] * 2,
    )
    if check != [1.0, 0.0]:
        raise RuntimeError(f"TRL reward function scores a right/wrong answer as {check}, expected [1.0, 0.0]")
    calls["reward"] = 0

    def dense_reward(completions, **kwargs) -> list[float]:
        calls["reward"] += 1
        score = DENSE_REWARDS[args.reward]
        return [score(c[-1]["content"] if isinstance(c, list) else c) for c in completions]

    micro = args.trl_micro_batch or args.prompts * args.samples  # one optimizer step per B*G completions either way
    config = GRPOConfig(
        output_dir=str(workdir / "trl-run"),
        use_cpu=args.device == "cpu",
        bf16=args.precision == "bf16",
        fp16=False,
        per_device_train_batch_size=micro,
        num_generations=args.samples,
        gradient_accumulation_steps=args.prompts * args.samples // micro,
        num_iterations=1,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=LR,
        adam_beta1=ADAM_BETAS[0],
        adam_beta2=ADAM_BETAS[1],
        weight_decay=0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=MAX_GRAD_NORM,
        max_steps=args.steps,
        gradient_checkpointing=args.trl_gradient_checkpointing,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    return {
        "model": str(workdir / "model"),
        "reward_funcs": task_reward if args.reward == "task" else dense_reward,
        "args": config,
        "train_dataset": dataset,
        "processing_class": tokenizer,
        "calls": calls,
    }


def time_generation(trainer, seconds: list[float]) -> None:
    """Append the seconds of each of TRL's generation calls (``_generate_single_turn``) to ``seconds``: a read-only
    wrapper on the trainer."""
    generate = trainer._generate_single_turn

    def timed_generate(*a, **kw):
        start = time.perf_counter()
        result = generate(*a, **kw)
        seconds.append(time.perf_counter() - start)
        return result

    trainer._generate_single_turn = timed_generate


def run_trl(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    setup = trl_setup(args, workdir)
    calls = setup.pop("calls")
    step_ends: list[float] = []
    peak_at_last_step: list[float] = []
    gpu_peak: list[float | None] = [None]
    step_logs: dict[int, dict] = {}

    class Timer(TrainerCallback):
        def on_step_end(self, args_, state, control, **kwargs):
            step_ends.append(time.perf_counter())
            peak_at_last_step[:] = [peak_rss_mb()]
            gpu_peak[:] = [gpu_peak_mb()]

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:  # the per-step training log (logging_steps=1)
                step_logs[state.global_step] = dict(logs)

    probe = DtypeProbe()
    baseline = rss_mb()
    trainer = GRPOTrainer(**setup, callbacks=[Timer()])
    generate_s: list[float] = []
    time_generation(trainer, generate_s)
    trainer.train()
    records = [step_logs[s] for s in sorted(step_logs)]
    n = args.prompts * args.samples
    return {
        "step_ends": step_ends,
        "tokens": [r["completions/mean_length"] * n for r in records],
        "generate_s": generate_s,
        "rewards": [r["reward"] for r in records],
        "losses": [r["loss"] for r in records],
        "reward_calls": calls["reward"],
        "baseline_mb": baseline,
        "peak_mb": peak_at_last_step[0],
        "exit_peak_mb": peak_rss_mb(),
        "dtypes": probe.seen,
        "threads": torch.get_num_threads(),
        "gpu_peak_mb": gpu_peak[0],
    }


def child(args: argparse.Namespace) -> None:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    result = (run_lmrl if args.child == "lmrl" else run_trl)(args, workdir)
    (workdir / f"{args.child}.json").write_text(json.dumps(result))


# ----------------------------------------------------------------------------- parent


def machine() -> str:
    model = platform.processor() or "?"
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    bf16 = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in flags] or ["no bf16 flags"]
    return f"{model}, {os.cpu_count()} CPUs, {'/'.join(bf16)}"


def run_child(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, *args.argv, "--child", name, "--workdir", str(workdir)]  # the parent's options
    log = workdir / f"{name}.log"
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with open(log, "w") as fh:
        code = subprocess.run(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "TQDM_DISABLE": "1"}
        ).returncode
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise RuntimeError(f"{name} run failed (exit {code}); last lines of {log}:\n{tail}")
    result = json.loads((workdir / f"{name}.json").read_text())
    result.update(wall_s=time.perf_counter() - start, load=(load_before, os.getloadavg()[0]))
    result.update(steady_state(result["step_ends"], result["tokens"], args.warmup))
    return result


def median_round(rounds: list[dict]) -> dict:
    """The round of median steps/s (the lower middle one of an even number; the first when unmeasured)."""
    if any(r["steps_per_s"] != r["steps_per_s"] for r in rounds):  # NaN: a memory-only run
        return rounds[0]
    return sorted(rounds, key=lambda r: r["steps_per_s"])[(len(rounds) - 1) // 2]


def framework_label(name: str, args: argparse.Namespace) -> str:
    if name == "lmrl":
        return "lmrl"
    from importlib.metadata import version

    return f"TRL {version('trl')}" + (" (grad. ckpt)" if args.trl_gradient_checkpointing else "")


def report(rounds: dict[str, list[dict]], args: argparse.Namespace, info: dict) -> None:
    """The table of each framework's median round, lmrl's memory model, and markdown rows to paste."""
    results = {name: median_round(rs) for name, rs in rounds.items()}
    gpu_name = ""
    if args.device == "cuda":
        import torch

        gpu_name = f"; GPU {torch.cuda.get_device_name()}, torch {torch.__version__}"
    print(f"\nmachine: {machine()}{gpu_name}; torch threads {next(iter(results.values()))['threads']}")
    print(f"lmrl overrides: {' '.join(args.lmrl_set) or 'none'}; TRL micro-batch {args.trl_micro_batch or 'B*G'}")
    print(
        f"model {info['name']} ({info['params_m']:.1f}M params), {args.prompts} prompts x {args.samples} samples x "
        f"{args.max_new_tokens} new tokens, {info['style']} prompts of {min(info['prompt_tokens'])}-"
        f"{max(info['prompt_tokens'])} tokens, {args.steps} steps ({args.warmup} warm-up), {args.precision}, "
        f"reward {args.reward}, median of {args.rounds} round(s)"
        + (", TRL gradient checkpointing on" if args.trl_gradient_checkpointing else "")
    )
    head = (
        f"{'framework':10s} {'steps/s':>8s} {'s/step':>7s} {'gen s/step':>10s} {'tok/s':>7s} {'len':>5s} "
        f"{'peak RSS MB':>11s} {'peak-base MB':>12s} {'exit MB':>8s} {'reward':>7s} {'loss':>9s}  dtypes (gen/train), load"
    )
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        dtypes = f"{r['dtypes'].get('generate', '?')}/{r['dtypes'].get('train', '?')}"
        print(
            f"{name:10s} {r['steps_per_s']:8.3f} {r['s_per_step']:7.2f} {generate_s(r, args):10.2f} "
            f"{r['tokens_per_s']:7.0f} {completion_len(r, args):5.1f} {r['peak_mb']:11.0f} "
            f"{r['peak_mb'] - r['baseline_mb']:12.0f} {r['exit_peak_mb']:8.0f} "
            f"{sum(r['rewards']) / len(r['rewards']):7.3f} {sum(r['losses']) / len(r['losses']):9.2e}  "
            f"{dtypes}, {r['load'][0]:.1f}->{r['load'][1]:.1f}"
        )
    if {"lmrl", "trl"} <= set(results):
        a, b = results["lmrl"], results["trl"]
        peak, above_base = memory_ratios(a, b)
        print(
            f"{'lmrl/TRL':10s} {a['steps_per_s'] / b['steps_per_s']:7.2f}x {'':7s} {'':10s} "
            f"{a['tokens_per_s'] / b['tokens_per_s']:6.2f}x {'':5s} {peak:10.2f}x {above_base:11.2f}x "
            f"{a['exit_peak_mb'] / b['exit_peak_mb']:7.2f}x"
        )
    for name, r in results.items():
        finite = all(x == x and abs(x) != float("inf") for x in r["losses"])
        extra = f", reward function called {r['reward_calls']} times" if "reward_calls" in r else ""
        if "skipped_rows" in r:  # zero-advantage rows lmrl did not forward (their gradient is exactly 0)
            extra += f", rows skipped as zero-advantage {100 * r['skipped_rows']:.0f}%"
        print(
            f"{name}: {len(r['step_ends'])} steps, losses finite: {finite}{extra}, child wall time {r['wall_s']:.0f} s"
        )
    gpu = {name: r.get("gpu_peak_mb") for name, r in results.items() if r.get("gpu_peak_mb") is not None}
    if gpu:
        print(
            "GPU peak (torch.cuda.max_memory_allocated at the last step), median round: "
            + ", ".join(f"{name} {mb:,.0f} MiB" for name, mb in gpu.items())
            + (f"; lmrl/TRL {gpu['lmrl'] / gpu['trl']:.2f}x" if {"lmrl", "trl"} <= set(gpu) else "")
        )
    if "lmrl" in results:
        print(f"lmrl memory model, median round (MiB; peak RSS resets per phase: {results['lmrl']['resets_peak']}):")
        print(*results["lmrl"]["memory_model"], sep="\n")
    report_rounds(rounds)
    print("\nsummary (markdown):")
    print(
        "| framework | steps/s | s/step | gen s/step | completion tok/s | mean len | peak RSS MiB | peak − base MiB | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        peaks = [x["peak_mb"] for x in rounds[name]]
        print(
            f"| {framework_label(name, args)} | {r['steps_per_s']:.3f} | {r['s_per_step']:.2f} | "
            f"{generate_s(r, args):.2f} | {r['tokens_per_s']:.0f} | {completion_len(r, args):.1f} | "
            f"{r['peak_mb']:,.0f} ({min(peaks):,.0f}-{max(peaks):,.0f}) | {r['peak_mb'] - r['baseline_mb']:,.0f} | "
            f"{r['load'][0]:.1f} |"
        )
    if {"lmrl", "trl"} <= set(results):
        a, b = results["lmrl"], results["trl"]
        peak, above_base = memory_ratios(a, b)
        print(f"| **lmrl/TRL** | **{median_ratio(rounds):.2f}x** | | | | | **{peak:.2f}x** | {above_base:.2f}x | |")


def memory_ratios(a: dict, b: dict) -> tuple[float, float]:
    """lmrl/TRL peak RSS, and peak minus the RSS before loading."""
    return a["peak_mb"] / b["peak_mb"], (a["peak_mb"] - a["baseline_mb"]) / (b["peak_mb"] - b["baseline_mb"])


def generate_s(r: dict, args: argparse.Namespace) -> float:
    """Mean generation seconds of the steady steps."""
    steady = r["generate_s"][args.warmup :]
    return sum(steady) / max(1, len(steady))


def completion_len(r: dict, args: argparse.Namespace) -> float:
    """Mean completion tokens per row over all steps."""
    return sum(r["tokens"]) / max(1, len(r["tokens"])) / (args.prompts * args.samples)


def median_ratio(rounds: dict[str, list[dict]]) -> float:
    """Median over rounds of lmrl/TRL steps/s, each round's two runs adjacent in time."""
    return statistics.median(a["steps_per_s"] / b["steps_per_s"] for a, b in zip(rounds["lmrl"], rounds["trl"]))


def report_rounds(rounds: dict[str, list[dict]]) -> None:
    """lmrl/TRL steps/s of each round (the two runs closest in time, so the least affected by the machine's drift)
    and their median, when there are several rounds of both."""
    if min(len(rounds.get("lmrl", [])), len(rounds.get("trl", []))) < 2:
        return
    ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(rounds["lmrl"], rounds["trl"])]
    print(
        f"lmrl/TRL steps/s per round (same round = adjacent runs): {', '.join(f'{r:.2f}x' for r in ratios)}; "
        f"median {statistics.median(ratios):.2f}x"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default="builtin:medium",
        help="built-in model (random init, seed 0), an HF model folder or a .gguf file (de-quantized "
        "to fp32 by lmrl's loader, saved once as an HF folder that both frameworks load)",
    )
    parser.add_argument(
        "--gpt2",
        action="store_true",
        help="build a GPT-2 instead (random init, seed 0; --hidden, --layers, heads of 32) with the "
        "builtin:bpe tokenizer",
    )
    parser.add_argument(
        "--task-style",
        choices=("auto", "plain", "chat"),
        default="auto",
        help="arithmetic prompts: plain '12+34=', or chat 'What is 12+34? Answer with the number "
        "only.'; auto: chat for a model folder or GGUF file, plain otherwise",
    )
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts per step (B)")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt (G); a step trains on B*G")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="completion length cap")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per framework")
    parser.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="first steps left out of the steady-state rate (>= 1); 0: peak memory only (--steps 1)",
    )
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="bf16 autocast or plain fp32")
    parser.add_argument(
        "--reward",
        choices=("digits", "hash", "task"),
        default="digits",
        help="digits: share of digit characters (dense: every group has reward variance, so both "
        "frameworks train on every row); hash: a pseudo-random number fixed by the completion's text (varies "
        "even where a large vocabulary makes digits rare); task: the arithmetic verifier (0 for a random model)",
    )
    parser.add_argument("--frameworks", default="lmrl,trl", help="comma-separated, run in this order")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the frameworks this many times, alternating; report each one's median round",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads in each run (0: torch's default)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: both train on the GPU (lmrl device=cuda, TRL use_cpu=False); the GPU peak is reported too",
    )
    parser.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="TRL's default; off by default so that both do the same forward/backward work",
    )
    parser.add_argument(
        "--qwen2-vocab", type=int, default=0, help="build a Qwen2-architecture model with this vocabulary"
    )
    parser.add_argument("--hidden", type=int, default=128, help="--qwen2-vocab, --gpt2: hidden size")
    parser.add_argument("--layers", type=int, default=2, help="--qwen2-vocab, --gpt2: decoder layers")
    parser.add_argument(
        "--trl-micro-batch",
        type=int,
        default=0,
        help="TRL per_device_train_batch_size (with gradient accumulation to B*G; 0: B*G at once)",
    )
    parser.add_argument(
        "--lmrl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra lmrl config override, e.g. gradient_checkpointing=true (repeatable)",
    )
    parser.add_argument("--workdir", help="keep the model, prompts, logs and run dirs here (default: a temp dir)")
    parser.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.qwen2_vocab and args.gpt2:
        parser.error("--qwen2-vocab and --gpt2 each build a model: give one.")
    if not (args.warmup == 0 or 1 <= args.warmup < args.steps):
        parser.error(
            f"--warmup must be at least 1 and less than --steps ({args.steps}), or 0 for peak memory only; "
            f"got {args.warmup}. Steady state is measured from the end of the last warm-up step."
        )
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}.")
    if args.samples < 2:
        parser.error("--samples must be >= 2: GRPO advantages need at least 2 completions per prompt.")
    unknown = set(args.frameworks.split(",")) - set(FRAMEWORKS)
    if unknown:
        parser.error(f"--frameworks: unknown {sorted(unknown)}; choose from {FRAMEWORKS}.")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        info = prepare(args, workdir)
        rounds: dict[str, list[dict]] = {}
        for round_ in range(1, args.rounds + 1):
            for name in args.frameworks.split(","):
                result = run_child(name, args, workdir)
                print(
                    f"round {round_} {name}: {result['steps_per_s']:.3f} steps/s, peak {result['peak_mb']:.0f} MB, "
                    f"load {result['load'][0]:.1f}",
                    flush=True,
                )
                rounds.setdefault(name, []).append(result)
        report(rounds, args, info)


if __name__ == "__main__":
    main()
