"""Keep freed CPU memory in the process, so each training step does not page-fault its activations in again.

glibc's malloc serves large blocks with fresh ``mmap`` pages and hands freed ones back to the kernel, and its
dynamic threshold only adapts once a block that size has been freed, so every new tensor shape early in a run
(and every step whose completion length differs) maps, zero-fills and faults hundreds of MB of new pages. Fixing
the mmap threshold at its maximum (32 MB on 64-bit) and never trimming the heap lets PyTorch's CPU allocations
reuse freed heap memory. Measured on builtin:medium, 64 rows x 57 tokens, bf16: the first training forwards
took 0.45-0.63 s with 57-190k minor page faults each, against 0.30 s once no page faulted; in GRPO runs
(benchmarks' settings, 10 steps, 3 alternating pairs) the mean training forward went from 0.38-0.42 s to 0.34-0.38 s
per step, with the same peak RSS. No-op where malloc is not glibc's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch
from torch.utils.checkpoint import checkpoint

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, glibc <malloc.h>
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
NEVER_TRIM = 2**31 - 1  # mallopt takes an int


@functools.cache
def keep_freed_memory() -> bool:
    """mallopt(M_MMAP_THRESHOLD, 32 MB) and mallopt(M_TRIM_THRESHOLD, never): True if glibc accepted both."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))


def enable_gradient_checkpointing(model) -> None:
    """Recompute each decoder layer's activations in the backward instead of keeping them (non-reentrant
    `torch.utils.checkpoint`), in training and in eval mode alike. Saves about (layers - 1) x the activations of
    one layer.

    HF's own `gradient_checkpointing_enable` checkpoints a layer only while its `training` flag is set, and RL
    keeps the policy in eval mode (no dropout); setting the flag on the layer switches on the dropout that layers
    such as OPT's apply themselves. So each decoder layer's ``forward`` is wrapped here instead: with gradients on,
    it runs under `checkpoint` with its KV cache dropped (the backward's recompute would write it a second time, as
    GPT-2's blocks do); without gradients (sampling) it runs as is.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(
            f"gradient_checkpointing: {type(model).__name__} has no decoder layers transformers marks as "
            "checkpointable (GradientCheckpointingLayer). Fix: gradient_checkpointing=false."
        )
    for layer in layers:
        if not getattr(layer, "lmrl_checkpointed", False):
            layer.forward = functools.partial(_checkpointed_forward, layer.forward)
            layer.lmrl_checkpointed = True


CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value", "layer_past")  # names across transformers versions


def _checkpointed_forward(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    for name in CACHE_ARGUMENTS:
        if kwargs.get(name) is not None:
            kwargs[name] = None
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def is_checkpointing(model) -> bool:
    """Whether the layers of ``model`` recompute activations in the backward (`enable_gradient_checkpointing`)."""
    return any(getattr(m, "lmrl_checkpointed", False) for m in model.modules())
