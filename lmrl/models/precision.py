"""Dtype policy: fp32 master weights and optimizer state, bf16 autocast for matmuls where it is fast.

``precision=auto`` uses bf16 autocast on GPUs with bf16, on CPUs with AMX tiles, and on other CPUs where a
probe matmul (128x1024 @ 1024x1024, best of 3, once per process) runs at least 1.25x faster in bf16 than in fp32.
CPUs with AVX512-BF16 differ: on a 2-core Xeon bf16 was *slower* (that matmul 10 ms vs 6 ms; an SFT step of
``builtin:tiny`` 0.087 s vs 0.044 s), on a 2-core AMD EPYC it is faster (2048x384 @ 384x1536: 5.6 ms vs 12.9 ms; an
SFT step of ``builtin:tiny`` 0.10 s vs 0.15 s), so auto measures instead of reading CPU flags.
``precision=bf16`` forces autocast, ``fp32`` turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from pathlib import Path

import torch

CPU_BF16_MIN_SPEEDUP = 1.25
RUN_FILE = "run.json"  # in a run directory: {"precision": "bf16" | "fp32"}, what the run computed in


def recorded_precision(run_dir: str | Path) -> str | None:
    """The precision a run in ``run_dir`` resolved to ("bf16" or "fp32"), so ``precision=auto`` resumes exactly
    (the probe of `cpu_bf16_speedup` may decide otherwise on another day or machine); None if not recorded."""
    try:
        value = json.loads((Path(run_dir) / RUN_FILE).read_text()).get("precision")
    except (OSError, ValueError, AttributeError):
        return None
    return value if value in ("bf16", "fp32") else None


def precision_of(dtype) -> str:
    """"bf16" for bf16 autocast, "fp32" for none: the name `recorded_precision` reads back."""
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """True when bf16 matmuls are fast on ``device``: CUDA with bf16, a CPU with AMX tiles, or a CPU where the
    probe matmul is at least ``CPU_BF16_MIN_SPEEDUP`` times faster in bf16 (`cpu_bf16_speedup`)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return bool(amx and amx()) or cpu_bf16_speedup() >= CPU_BF16_MIN_SPEEDUP
    return False


@functools.cache
def cpu_bf16_speedup() -> float:
    """fp32 time / bf16 time of a 128x1024 @ 1024x1024 matmul on this CPU (best of 3 after a warm-up; ~10-50 ms)."""

    def best_time(dtype: torch.dtype) -> float:
        a, b = torch.ones(128, 1024, dtype=dtype), torch.ones(1024, 1024, dtype=dtype)
        a @ b  # warm-up (kernel selection, packing)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    return best_time(torch.float32) / best_time(torch.bfloat16)


def autocast_dtype(precision: str, device: torch.device | str = "cpu") -> torch.dtype | None:
    """The autocast dtype for a ``precision`` setting: "bf16", "fp32" or "auto" (bf16 when supported)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision == "auto":
        return torch.bfloat16 if bf16_supported(device) else None
    raise ValueError(f"precision must be auto, bf16 or fp32, got {precision!r}")


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``dtype``, or a no-op context when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
