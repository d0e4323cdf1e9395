"""Dtype policy: fp32 master weights and optimizer state, bf16 autocast for matmuls where it is fast.

``precision=auto`` uses bf16 autocast on GPUs with bf16 and on CPUs with AMX
tiles. On CPUs with only AVX512-BF16 we measured bf16 *slower* than fp32 for the
built-in model sizes (an SFT step of ``builtin:tiny``: 0.087 s bf16 vs 0.044 s
fp32; a 128x1024 @ 1024x1024 matmul: 10 ms vs 6 ms), so auto stays fp32 there;
``precision=bf16`` forces autocast.
"""

from __future__ import annotations

import contextlib

import torch


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """True when bf16 matmuls are fast on ``device`` (CUDA with bf16, or a CPU with AMX tiles)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return bool(amx and amx())
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
