"""Dtype policy: fp32 master weights and optimizer state, bf16 autocast for matmuls where the hardware has it.

On CPUs with AVX512-BF16 or AMX, bf16 matmuls run several times faster than fp32
(about 7x on the machines lmrl is developed on); on GPUs bf16 is the norm.
"""

from __future__ import annotations

import contextlib

import torch


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """True when bf16 matmuls are fast on ``device`` (CUDA with bf16, or a CPU with AVX512-BF16/AMX)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        checks = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
        return any(check() for check in checks if check is not None)
    return False


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
