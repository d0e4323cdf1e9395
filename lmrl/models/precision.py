"""Dtype policy: fp32 master weights and optimizer state, bf16 autocast for matmuls where the hardware has it.

``precision=auto`` is decided from the device alone, so the same config gives the same numbers on a quiet or a
loaded machine: bf16 autocast on GPUs with bf16 and on CPUs with AMX tiles (Intel Sapphire Rapids and later, where
bf16 matmuls run on the tile unit), fp32 elsewhere. (A timing probe decided it before: on a 2-core machine it picked
bf16 when quiet and fp32 under load, so results depended on what else ran.) CPUs with AVX512-BF16 but no AMX are
left at fp32: bf16 was slower there on a 2-core Xeon and faster on a 2-core AMD EPYC; ``precision=bf16`` forces
autocast where it pays, ``fp32`` turns it off.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

RUN_FILE = "run.json"  # in a run directory: {"precision": "bf16" | "fp32"}, what the run computed in


def recorded_precision(run_dir: str | Path) -> str | None:
    """The precision a run in ``run_dir`` resolved to ("bf16" or "fp32"), so ``precision=auto`` resumes exactly
    (another machine may decide otherwise); None if not recorded."""
    try:
        value = json.loads((Path(run_dir) / RUN_FILE).read_text()).get("precision")
    except (OSError, ValueError, AttributeError):
        return None
    return value if value in ("bf16", "fp32") else None


def precision_of(dtype) -> str:
    """ "bf16" for bf16 autocast, "fp32" for none: the name `recorded_precision` reads back."""
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """True when ``device`` computes bf16 matmuls in hardware: CUDA with bf16, or a CPU with AMX tiles."""
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
