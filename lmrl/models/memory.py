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
import os

import torch
from torch.utils.checkpoint import checkpoint

from lmrl.models import usage

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


HUGE_PAGES_VARIABLE = "THP_MEM_ALLOC_ENABLE"  # read by PyTorch's CPU allocator at its first allocation of >= 2 MiB


def use_huge_pages() -> bool:
    """Ask PyTorch to put every CPU tensor of 2 MiB or more on transparent huge pages (``THP_MEM_ALLOC_ENABLE=1``:
    2 MiB-aligned, ``madvise(MADV_HUGEPAGE)``): one page fault and one TLB entry per 2 MiB instead of per 4 KiB.
    PyTorch reads the variable once, at its first allocation of that size, so this must run before the model
    loads; a user's own setting of the variable is kept. Returns whether the kernel backs such tensors with huge
    pages (``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or ``madvise``); `huge_page_mib` shows
    what the process really got. Measured on SmolLM2-135M GRPO (docs/benchmarks.md): sampling and training both
    faster, and the peak lower."""
    os.environ.setdefault(HUGE_PAGES_VARIABLE, "1")
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:  # not Linux, or no THP support
        return False


def _proc_kib(path: str, key: str) -> int:
    """A ``key:  N kB`` line of a /proc file, in KiB (0 where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def huge_page_mib() -> float:
    """MiB of this process's anonymous memory on transparent huge pages (``AnonHugePages``, /proc/self/smaps_rollup)."""
    return _proc_kib("/proc/self/smaps_rollup", "AnonHugePages") / 1024


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (``VmHWM``, /proc/self/status), MiB; 0 where there is none."""
    return _proc_kib("/proc/self/status", "VmHWM") / 1024


def step_metrics() -> dict[str, float]:
    """What a training step logs about memory: the process's peak RSS and its huge-page MiB (CPU, Linux), the
    peak CUDA memory PyTorch allocated (GPU)."""
    metrics = {}
    if os.path.exists("/proc/self/status"):
        metrics["memory/peak_rss_mib"] = peak_rss_mib()
        metrics["memory/huge_pages_mib"] = huge_page_mib()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        metrics["memory/peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return metrics


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_SINCE_RELEASE = [0]  # resident bytes right after the last release


def resident_bytes() -> int:
    """This process's resident memory (RSS), from /proc/self/statm; 0 where there is none."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


MIN_GROWTH = 256 * 2**20
"""`release_free_memory` trims only when the resident memory grew by this much since its last trim: a trim walks
the whole heap (10-70 ms on SmolLM2-135M's) and the pages it returns fault in again when reused, so small models
and small forwards (the shared prompts') pay for nothing."""


def release_free_memory(min_growth: int | None = None) -> bool:
    """glibc's ``malloc_trim(0)``: hand every whole free page of malloc's heap back to the system (freed tensors
    leave holes between live ones that stay resident otherwise), when the resident memory grew by at least
    ``min_growth`` bytes (default `MIN_GROWTH`; 0: always) since the last release. True if memory was released;
    False where malloc is not glibc's or the memory did not grow enough."""
    trim = _malloc_trim()
    min_growth = MIN_GROWTH if min_growth is None else min_growth
    if trim is None or (min_growth and resident_bytes() - _SINCE_RELEASE[0] < min_growth):
        return False
    usage.count("memory_releases")
    released = bool(trim(0))
    _SINCE_RELEASE[0] = resident_bytes()
    return released


def release_memory_in_layers(model, every: int = 10) -> int:
    """With gradients on, `release_free_memory` after the forward of every ``every``-th decoder layer and when the
    backward reaches that layer's output: the free heap a training forward and backward leave behind (1-2 GiB on
    SmolLM2-135M, docs/benchmarks.md) never piles up. Returns how many layers release. Idempotent."""
    layers = decoder_layers(model)
    for index, layer in enumerate(layers):
        if index % every == every - 1 and not getattr(layer, "lmrl_releases_memory", False):
            layer.register_forward_hook(_release_after)
            layer.lmrl_releases_memory = True
    return sum(getattr(layer, "lmrl_releases_memory", False) for layer in layers)


def _release_after(module, inputs, output) -> None:
    if not torch.is_grad_enabled():
        return
    release_free_memory()
    hidden = output[0] if isinstance(output, tuple) else output
    if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
        hidden.register_hook(_release_in_backward)


def _release_in_backward(grad: torch.Tensor) -> None:
    release_free_memory()


def decoder_layers(model) -> list:
    """The decoder layers of an HF model (those transformers marks as checkpointable)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


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
    layers = decoder_layers(model)
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
    """A decoder layer's forward, recomputed in the backward; without a KV cache, which the recompute would append
    to a second time (GPT-2 hands its cache positionally, others by keyword)."""
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    from transformers.cache_utils import Cache

    args = tuple(None if i > 0 and isinstance(arg, Cache) else arg for i, arg in enumerate(args))
    for name in CACHE_ARGUMENTS:
        if kwargs.get(name) is not None:
            kwargs[name] = None
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def is_checkpointing(model) -> bool:
    """Whether the layers of ``model`` recompute activations in the backward (`enable_gradient_checkpointing`)."""
    return any(getattr(m, "lmrl_checkpointed", False) for m in model.modules())
