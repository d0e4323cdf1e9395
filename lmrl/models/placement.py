"""Device placement: which device a run uses, and moving batches to a model's device.

`device=auto` is CUDA when available, else the CPU (as TRL and accelerate decide). Every model of a run goes
to that device in `ModelSetup`; batches are built on the CPU by the data layer and moved with `to_device`
where a trainer hands them to a model, so the same trainer code runs on either.
"""

from __future__ import annotations

from typing import Any

import torch

from lmrl.config import DEVICE_PATTERN


def resolve_device(name: str) -> torch.device:
    """The torch device for a ``device`` setting: auto | cpu | cuda | cuda:N (errors name the fix)."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ValueError(f"device={name!r} is not one of auto, cpu, cuda, cuda:N.")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={name} but this torch ({torch.__version__}) sees no CUDA GPU. "
                "Fix: device=cpu (or auto), or install a CUDA build of torch on a machine with a GPU."
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={name} but only {torch.cuda.device_count()} CUDA device(s) exist: "
                f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1}."
            )
    return device


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter (CPU for a model without parameters)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The tensors of ``batch`` on ``device`` (other values as they are); no copy when already there."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
