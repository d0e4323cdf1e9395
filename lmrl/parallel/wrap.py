"""Data parallelism for a run's models with torch.distributed's own engines, applied in place (the module keeps
its class and attributes, so every trainer uses it unchanged).

- ``parallel=fsdp``: FSDP2 ``fully_shard`` on each decoder layer and on the whole model: parameters, gradients and
  optimizer state are sharded over the ranks (ZeRO-3); ``MixedPrecisionPolicy`` all-gathers in the run's autocast
  dtype (bf16) on GPUs and reduces gradients in fp32. Frozen models (reference, critic) are sharded the same way.
- ``parallel=ddp``: ``replicate`` (DDP's reducer, composable form): every rank holds the full model and
  gradients are all-reduced in the backward. The fallback when a model does not shard (e.g. LoRA adapters).

Both average gradients over ranks; `lmrl.trainers.common.optimizer_step` multiplies them by the world size, because
every trainer's per-rank loss is its part of the global loss (normalised by global token or example counts).
"""

from __future__ import annotations

import types

import torch

from lmrl.parallel import runtime


def block_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (HF ``_no_split_modules``, e.g. LlamaDecoderLayer): one FSDP unit each."""
    names = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or [])}
    return [m for m in model.modules() if type(m).__name__ in names]


def wrap(model: torch.nn.Module, parallel: str, dtype: torch.dtype | None, trainable: bool = True) -> torch.nn.Module:
    """``model`` made data-parallel in place over the process group (unchanged with one process)."""
    if runtime.world() == 1:
        return model
    if parallel == "ddp":
        if not trainable:  # a frozen model needs no gradient reduction: every rank keeps its full copy
            return model
        from torch.distributed._composable.replicate import replicate

        replicate(model, broadcast_buffers=False)  # buffers (rotary tables) are computed, never trained
        replicate.state(model).lazy_init()  # now, on every rank (its collective would hang in a rank-0-only eval)
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    # GPU: all-gather in bf16 (half the traffic); CPU: fp32 parameters under the run's autocast, as in one process
    on_gpu = next(model.parameters()).device.type == "cuda"
    policy = MixedPrecisionPolicy(param_dtype=dtype if on_gpu else None, reduce_dtype=torch.float32)
    for block in block_modules(model):
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    # the chunked LM head calls the decoder and the head apart (lmrl.models.head.HeadParts.run): through this method
    # FSDP gathers the root's parameters around them and reduces their gradients, as around the model's forward
    model.lmrl_split_forward = types.MethodType(split_forward, model)
    register_fsdp_forward_method(model, "lmrl_split_forward")
    return model


def split_forward(module: torch.nn.Module, fn, *args):
    """``fn(*args)`` run as a forward of ``module`` (registered for FSDP in `wrap`)."""
    return fn(*args)
