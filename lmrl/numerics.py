"""Tolerances that come from the computation, never from one machine.

Two correct ways of computing the same thing in floating point differ by rounding, and by how much depends on the
CPU's kernels (``ATEN_CPU_CAPABILITY``, oneDNN's ISA), the thread count and the batch layout: on a 2-core AMD EPYC
SmolLM2's fp32 logits at identical positions of two batch rows differ by 2.0e-4, on an Intel Xeon by 0. A check that
decides "the same or not" with a constant tuned on one machine refuses good models, or silently switches a speed-up
off, on another. Every start-up check in lmrl decides with one of these bounds instead:

- `matmul_bound`: the classical forward-error bound of a matrix product, where the computation is one product.
- `rounding_bound`: for a deep computation (a whole model, a fused layer) whose worst-case bound is useless: a margin
  times the spread between the reference and the same values computed again in other float orders (another batch
  row, batch size or precision), and at least a floor of units in the last place of the values' scale.
- `model_ulps`: that floor for a model, sqrt(hidden) * layers units of roundoff (rounding errors of an inner product
  of length n grow like sqrt(n) u, Higham & Mary 2019, "A New Approach to Probabilistic Rounding Error Analysis";
  one such product per layer, the layers in sequence).

What the checks look for (a model attending both ways, a missing logit scale, a packed row leaking into the next)
changes values by O(1) of their scale, orders of magnitude above these bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Agreement", "agreement", "compute_dtype", "matmul_bound", "model_ulps", "rounding_bound", "unit_roundoff"]

MARGIN = 8.0
"""How many times the measured spread two computations may differ by: the spread is one sample of the rounding
noise, a few samples of it reach several times one; O(1) differences are still orders of magnitude above."""


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps / 2: the largest relative error of one rounding to ``dtype`` (2^-24 in fp32, 2^-8 in bf16)."""
    return torch.finfo(dtype).eps / 2


def matmul_bound(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype, accumulate=torch.float32) -> torch.Tensor:
    """Elementwise bound on how far two correct kernels' ``x @ w.T`` may differ. Each is within
    gamma_K |x| |w|^T + u_out |x w^T| of the exact product (Higham, *Accuracy and Stability of Numerical Algorithms*,
    eq. 3.5: |fl(x.y) - x.y| <= gamma_n |x|.|y|, gamma_n = n u / (1 - n u), plus the rounding of the output to
    ``out_dtype``), so two of them are within twice that. In float64, for the inputs as given."""
    k = x.shape[-1]
    u = unit_roundoff(accumulate)
    gamma = k * u / (1 - k * u)
    x64, w64 = x.double(), w.double()
    return 2 * (gamma * (x64.abs() @ w64.abs().T) + unit_roundoff(out_dtype) * (x64 @ w64.T).abs())


def compute_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype ``module``'s forward rounds to here: autocast's where it is on, else its first floating parameter's."""
    param = next((p for p in module.parameters() if p.is_floating_point()), None)
    device = param.device.type if param is not None else "cpu"
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return param.dtype if param is not None else torch.float32


def model_ulps(model: torch.nn.Module) -> float:
    """sqrt(hidden) * layers: the floor of `rounding_bound` for a model's outputs (see the module docstring)."""
    hf_config = getattr(model, "config", None)  # transformers' config: its keys vary by architecture
    text = getattr(hf_config, "text_config", None) or hf_config
    hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None) or 1024
    layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None) or 32
    return math.sqrt(hidden) * layers


def rounding_bound(
    reference: torch.Tensor, repeats, *, dtype: torch.dtype, floor_ulps: float, margin: float = MARGIN
) -> float:
    """How far another computation of ``reference`` may differ from it by rounding alone: ``margin`` times the largest
    spread between ``reference`` and ``repeats`` (the same values computed again in other float orders), and at least
    ``floor_ulps`` units of ``dtype``'s roundoff of the values' scale (max |reference|)."""
    spread = max(((reference - r).abs().max().item() for r in repeats), default=0.0)
    scale = reference.abs().max().item()
    return max(margin * spread, floor_ulps * unit_roundoff(dtype) * scale)


@dataclass(frozen=True)
class Agreement:
    """The outcome of comparing two computations: the greatest difference and the rounding bound it was held to."""

    difference: float
    bound: float

    def __bool__(self) -> bool:
        return math.isfinite(self.difference) and self.difference <= self.bound

    def __str__(self) -> str:
        return f"differs by {self.difference:.3g}, rounding allows {self.bound:.3g}"


def agreement(a: torch.Tensor, b: torch.Tensor, bound: float) -> Agreement:
    """``a`` against ``b`` (the same shape) under ``bound``; a shape mismatch or a NaN disagrees."""
    if a.shape != b.shape:
        return Agreement(math.inf, bound)
    difference = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    return Agreement(difference if math.isfinite(difference) else math.inf, bound)
