"""The training forward's plan: which speed tricks a run's log-prob forwards use, decided once, each off with a reason.

    plan = ForwardPlan.resolve(model, ForwardOptions(...))   # once per run and model, from the config
    print(plan.describe())                                   # the start-up line: what is on, what is off and why
    logp, entropy = plan.logprobs(model, ids, mask, P, entropy=True, linear_outputs=batch.linear_outputs)

The tricks, each in its own module: prompts shared by a group run once (`shared_prompt_outputs`), the LM head in
chunks (`lmrl.models.head`), the sampler's layer outputs replayed (`lmrl.models.replay`), rows packed into one
sequence (`packed_outputs`), saves rebuilt in the backward (`lmrl.models.rebuild`), fused layers
(`lmrl.models.fused`, applied when the model is set up), free memory released (`lmrl.models.memory`). The rules
that switch one off because of the model or another trick live in `resolve` only; what each forward really did is
counted (`lmrl.models.usage`), so the metrics say what ran, never what was asked. A new trick is a module, a field
here and a rule in `resolve`; the RL update does not change for it.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from lmrl.models import fused, usage
from lmrl.models.head import DEFAULT_CHUNK_MB, chunked_head
from lmrl.models.hf_compat import accepts_kwarg, cache_kwarg
from lmrl.models.logprobs import (
    adapters_off,
    completion_hidden,
    entropy_from_logits,
    packed_outputs,
    prompt_groups,
    selective_log_softmax,
    shared_prompt_outputs,
    valid_head_logprobs,
)
from lmrl.models.memory import is_checkpointing
from lmrl.models.rebuild import saving_less
from lmrl.models.replay import SamplingRecorder, has_dropout, replaying
from lmrl.parallel import runtime

__all__ = ["ForwardOptions", "ForwardPlan", "completion_logprobs"]


@dataclasses.dataclass(frozen=True)
class ForwardOptions:
    """What a run asks of its training forwards (from its config); `ForwardPlan.resolve` decides what it gets."""

    temperature: float = 1.0
    dtype: torch.dtype | None = None
    """autocast dtype of the forwards (None: the model's own)"""
    chunk_mb: float = DEFAULT_CHUNK_MB
    share_prompts: bool = True
    max_tokens: int | None = None
    """max_tokens_per_microbatch: the update's micro-batches are rows packed into one sequence"""
    replay: bool | None = False
    """reuse_sampling_forward (None: on where the HF engine samples on a CPU)"""
    updates_per_step: int = 1
    engine: str = "hf"
    sampler: str = "local"
    """the group sampler (`lmrl.rollout.samplers.factory.sampler_name`): only the local one records"""
    rollouts_per_step: int = 1
    """rollouts a process runs per step (sampling_shards per process): a record must be one rollout's rows"""
    release_memory: bool = True
    entropy_grad: bool = False
    """an entropy bonus in the loss: the training forward's entropy keeps its gradient"""


@dataclasses.dataclass(frozen=True)
class ForwardPlan:
    """How completion log-probs are computed for one model: the tricks on, and why each asked-for one is off.

    A plan built directly (``ForwardPlan(share_prompts=True)``) is taken as it is; `resolve` applies the rules."""

    temperature: float = 1.0
    dtype: torch.dtype | None = None
    chunk_mb: float = DEFAULT_CHUNK_MB
    """the (N, T, V) fp32 logits above this run through the LM head in chunks (`lmrl.models.head`)"""
    share_prompts: bool = False
    packed: bool = False
    replay: bool = False
    """the sampler records its linear-layer outputs and the update's forward returns them (`lmrl.models.replay`)"""
    release_memory: bool = False
    entropy_grad: bool = False
    fused_modules: int = 0
    """modules of the model that run a fused forward (`lmrl.models.fused`; applied when the model was set up)"""
    off: tuple[tuple[str, str], ...] = ()
    """(trick, why) for each trick asked for and switched off"""

    @classmethod
    def resolve(cls, model, options: ForwardOptions, device: torch.device | str = "cpu") -> ForwardPlan:
        """The plan for ``model`` on ``device``: each trick of ``options`` unless a rule switches it off."""
        device, off = torch.device(device), []

        def rule(asked: bool, trick: str, reasons: list[tuple[bool, str]]) -> bool:
            why = next((text for failed, text in reasons if failed), None) if asked else None
            if why is not None:
                off.append((trick, why))
            return asked and why is None

        packed = options.max_tokens is not None
        share = rule(
            options.share_prompts,
            "shared prompts",
            [
                (packed, "packed micro-batches run every row's tokens as one sequence"),
                (cache_kwarg(model) is None, "the model's forward takes no KV cache"),
                (
                    is_checkpointing(model),
                    "gradient checkpointing: a checkpointed layer cannot take the prompt's cache",
                ),
            ],
        )
        replay = rule(
            options.replay if options.replay is not None else (options.engine == "hf" and device.type == "cpu"),
            "replayed sampling forward",
            [
                (options.engine != "hf", f"engine={options.engine} keeps no layer outputs"),
                (options.sampler != "local", f"the {options.sampler} sampler keeps no layer outputs"),
                (options.rollouts_per_step > 1, "sampling_shards: the record must be one rollout's rows"),
                (runtime.world() > 1, "several processes: the record must be one rollout's rows"),
                (not share, "it replays through the shared-prompt forward, which is off"),
                (options.updates_per_step != 1, "after the first update the weights are no longer the sampler's"),
                (has_dropout(model), "the model has dropout: its training forward is not the sampler's"),
            ],
        )
        return cls(
            options.temperature,
            options.dtype,
            options.chunk_mb,
            share,
            packed,
            replay,
            rule(options.release_memory, "memory release", [(device.type != "cpu", "only a CPU's malloc heap")]),
            options.entropy_grad,
            fused.fused_count(model),
            tuple(off),
        )

    @property
    def recorder(self) -> SamplingRecorder | None:
        """What the sampler records the sampling forwards with, for the update to replay (None: nothing)."""
        return SamplingRecorder() if self.replay else None

    def scoring(self) -> ForwardPlan:
        """This plan for forwards without gradient (reference and old log-probs): padded rows, nothing replayed."""
        return dataclasses.replace(self, packed=False, replay=False, entropy_grad=False)

    def describe(self) -> str:
        """One line: the tricks on, and each one off with its reason."""
        on = [
            name
            for name, used in (
                ("shared prompts", self.share_prompts),
                ("packed rows", self.packed),
                ("replayed sampling forward", self.replay),
                (f"{self.fused_modules} fused layers", self.fused_modules > 0),
                ("memory release", self.release_memory),
            )
            if used
        ]
        on += [f"chunked LM head above {self.chunk_mb:g} MiB of logits", "rebuilt saves"]
        off = "".join(f"; {trick} off: {why}" for trick, why in self.off)
        return f"training forward: {', '.join(on)}{off}"

    @torch.no_grad()
    def scores(self, model, batch) -> torch.Tensor:
        """Log-probs (N, T) of a `RolloutBatch`'s completions without gradient (reference and old policy): padded
        rows, nothing replayed; FSDP: the model resharded after (its root unit must not stay gathered)."""
        logp = self.scoring().logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1])
        runtime.reshard(model)
        return logp

    def logprobs(
        self,
        model,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_start: int,
        entropy: bool = False,
        linear_outputs=None,
    ):
        """`completion_logprobs` under this plan."""
        return completion_logprobs(model, input_ids, attention_mask, completion_start, self, entropy, linear_outputs)


def completion_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_start: int,
    plan: ForwardPlan = ForwardPlan(),
    entropy: bool = False,
    linear_outputs=None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (N, T) of the completion tokens under softmax(logits / temperature), from one forward pass.

    input_ids, attention_mask: (N, P+T), prompt left-padded, completion right-padded; completion_start = P.
    position_ids = cumsum(attention_mask) - 1, so left padding does not shift positions (same as generation).
    Log-probs are computed in fp32 from the logits; positions whose attention_mask is 0 get 0. With ``entropy``, also
    the entropy (N, T) of the same distributions, without gradient (a metric) unless the plan's ``entropy_grad`` (an
    entropy bonus in the loss: then the full logits are built, no chunked head). Gradients flow unless the caller
    disables them.

    The plan's tricks, each the same values and gradients up to rounding: ``share_prompts``, rows with the same
    prompt run it once and their completions attend to its KV cache (`shared_prompt_outputs`; (G-1)/G fewer prompt
    FLOPs); ``linear_outputs`` (`RolloutBatch.linear_outputs`) with shared prompts: layers return the sampler's
    outputs instead of recomputing them (`lmrl.models.replay`) while the weights are still the sampler's;
    ``chunk_mb``: when the (N, T, V) fp32 logits would exceed it, the hidden states go through the LM head in chunks
    (`lmrl.models.head`); ``packed``: the rows' real tokens run as one sequence (`packed_outputs`). What ran is
    counted (`lmrl.models.usage`): forwards, shared_prompts, chunked_head, packed, replayed / computed layer calls,
    rebuilt saves and bytes, forward_fused.
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"completion_logprobs: input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
            "must both be (N, P+T)."
        )
    seq_len = input_ids.shape[1]
    if not 1 <= completion_start < seq_len:
        raise ValueError(
            f"completion_logprobs: completion_start={completion_start} must be in [1, {seq_len}) for sequences of "
            f"length {seq_len}: at least one prompt token (the first completion token is predicted from it) and one "
            "completion token."
        )
    if not plan.temperature > 0:
        raise ValueError(f"completion_logprobs: temperature must be > 0, got {plan.temperature}.")
    width = seq_len - completion_start  # T
    temperature, chunk_mb, packed = plan.temperature, plan.chunk_mb, plan.packed
    position_ids = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)  # (N, P+T)
    ctx = (
        torch.autocast(input_ids.device.type, dtype=plan.dtype) if plan.dtype is not None else contextlib.nullcontext()
    )
    groups = prompt_groups(input_ids, attention_mask, completion_start) if plan.share_prompts and not packed else None
    targets = input_ids[:, completion_start:]  # (N, T)
    valid = attention_mask[:, completion_start:] != 0  # (N, T)
    parts = (
        chunked_head(model, targets.numel(), chunk_mb, sharded=True) if not (entropy and plan.entropy_grad) else None
    )
    replay = (
        replaying(model, linear_outputs if not packed else None, prompt_rows=groups[0])
        if groups is not None
        else contextlib.nullcontext({})
    )
    with usage.counting() as own, ctx, replay as replayed, saving_less() as rebuilt:
        if parts is not None:

            def split():
                if packed:
                    hidden = packed_outputs(
                        parts.decoder, input_ids, attention_mask, completion_start, "last_hidden_state"
                    )
                else:
                    hidden = completion_hidden(
                        parts.decoder, input_ids, attention_mask, position_ids, completion_start, groups
                    )
                return valid_head_logprobs(
                    parts, hidden, targets, valid, temperature=temperature, chunk_mb=chunk_mb, return_entropy=entropy
                )

            with adapters_off(model):
                out = parts.run(split)
        elif packed:
            logits = packed_outputs(model, input_ids, attention_mask, completion_start, "logits")
        elif groups is not None:
            logits = shared_prompt_outputs(model, input_ids, attention_mask, position_ids, completion_start, *groups)
        else:
            extra = {"logits_to_keep": width + 1} if accepts_kwarg(model, "logits_to_keep") else {}
            if accepts_kwarg(model, "use_cache"):  # else GPT-2 & co. build a KV cache nobody reads
                extra["use_cache"] = False
            logits = model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **extra
            ).logits
            logits = logits[:, -(width + 1) : -1]  # (N, T, V): logits at P-1 .. P+T-2
    counts = {"forwards": 1, "packed": packed, "shared_prompts": groups is not None, "chunked_head": parts is not None}
    for name, n in {**counts, **replayed, **rebuilt, "forward_fused": own.total_of("fused_")}.items():
        usage.count(name, int(n))
    if parts is not None:
        if not entropy:
            return torch.where(valid, out, torch.zeros_like(out))
        return tuple(torch.where(valid, x, torch.zeros_like(x)) for x in out)
    logp = selective_log_softmax(logits, targets, temperature=temperature)
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    if not entropy:
        return logp
    with torch.no_grad() if not plan.entropy_grad else contextlib.nullcontext():
        ent = entropy_from_logits(logits, temperature=temperature)
    return logp, torch.where(valid, ent, torch.zeros_like(ent))
