"""CPU sampling under bf16 autocast with each linear layer's weight packed once per rollout.

A decode step multiplies a few rows by every weight of the model. Under autocast, PyTorch's bf16 ``F.linear`` on a
CPU calls oneDNN, which reorders the (cached) bf16 weight into its blocked layout at every call.
``torch.ops.mkldnn._reorder_linear_weight`` does that once (as inductor's CPU weight freezing does) and
``torch.ops.mkldnn._linear_pointwise`` multiplies by the packed weight: the same kernels, outputs equal to autocast's
``F.linear`` up to rounding (bitwise on the Xeons it was built on; checked for each weight shape before it is used
against the matmul's rounding bound; a shape that fails keeps ``F.linear``).

Measured on the Intel Xeon (AMX), one thread, (32, 576) x (576, 1536)^T: 404 us per call through ``F.linear`` with
a bf16 weight, 298 us packed; SmolLM2-135M's LM head (49,152 x 576): 15.1 vs 13.1 ms. Sampling only: no autograd
(the packed op has no backward), so `packed_linears` does nothing while gradients are on. each packed forward that
runs is counted (`lmrl.models.usage`: ``packed_linear_calls``) (the metric that says they ran is this count, never a setting).
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from lmrl.models import usage
from lmrl.notices import model_name, switched_off
from lmrl.numerics import matmul_bound

__all__ = ["available", "packed_linears"]


@functools.cache
def available() -> bool:
    """oneDNN with bf16 support and the two ops this module uses."""
    ops = torch.ops.mkldnn
    try:
        return (
            torch.backends.mkldnn.is_available()
            and bool(ops._is_mkldnn_bf16_supported())
            and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")
        )
    except (AttributeError, RuntimeError):
        return False


def _pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(torch.bfloat16), rows)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), packed, bias, "none", [], "")


@functools.cache
def reproduces(out_features: int, in_features: int, bias: bool) -> bool:
    """The packed product equals autocast's ``F.linear`` for this weight shape up to rounding, on random data at 1, 7
    and 32 rows: both multiply the same bf16 operands with fp32 accumulation, so they may differ by at most
    `lmrl.numerics.matmul_bound` elementwise (the accumulation order and the rounding of the output to bf16; bitwise
    equal on the Xeons lmrl was built on). A kernel computing something else is off by O(1)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=generator)
    b = torch.randn(out_features, generator=generator) if bias else None
    packed = _pack(weight, 32)
    b16 = None if b is None else b.to(torch.bfloat16)
    w16 = torch.cat([weight, b[:, None]], 1) if b is not None else weight
    with torch.no_grad():
        for m in (1, 7, 32):
            x = torch.randn(m, in_features, generator=generator)
            with torch.autocast("cpu", torch.bfloat16):
                expected = F.linear(x, weight, b)
            x16 = torch.cat([x, torch.ones(m, 1)], 1) if b is not None else x
            bound = matmul_bound(x16.bfloat16(), w16.bfloat16(), torch.bfloat16)
            if not bool(((_packed_linear(x, packed, b16).double() - expected.double()).abs() <= bound).all()):
                return False
    return True


def _packable(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module) is torch.nn.Linear  # not a subclass (quantized, LoRA) whose forward does more
        and "forward" not in vars(module)  # not already swapped (replay, checkpointing)
        and type(weight) is torch.nn.Parameter  # not a DTensor (FSDP) or a quantized tensor
        and weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
    )


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module, dtype: torch.dtype | None, rows: int):
    """Within the block, every plain ``nn.Linear`` of ``model`` on the CPU multiplies by a bf16 weight packed at
    entry (``rows``: the batch the packing is laid out for; any batch works), when ``dtype`` is bf16, oneDNN supports
    it, gradients are off and the packed product reproduces ``F.linear`` for the layer's shape. Yields how many
    layers were swapped; the weights are read at entry, so the block must not change them."""
    if dtype != torch.bfloat16 or torch.is_grad_enabled() or not available():
        if dtype == torch.bfloat16 and not torch.is_grad_enabled() and not available():
            switched_off(
                "the packed bf16 linear",
                model_name(model),
                "oneDNN has no bf16 on this CPU (or ONEDNN_MAX_CPU_ISA hides it); sampling multiplies through "
                "F.linear (metric rollout/packed_linear_calls: 0)",
            )
        yield 0
        return
    swapped = []
    try:
        for module in model.modules():
            if not _packable(module):
                continue
            has_bias = module.bias is not None
            if not reproduces(module.out_features, module.in_features, has_bias):
                switched_off(
                    "the packed bf16 linear",
                    f"{model_name(model)}'s {module.in_features} -> {module.out_features} layers",
                    "oneDNN's packed product is not autocast's F.linear up to the product's rounding bound on this "
                    "CPU; they keep F.linear (metric rollout/packed_linear_calls counts the packed calls)",
                )
                continue
            packed = _pack(module.weight, max(1, rows))
            bias = module.bias.detach().to(torch.bfloat16) if has_bias else None
            module.forward = functools.partial(_counted, packed, bias)
            swapped.append(module)
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward  # back to the class's forward


def _counted(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    usage.count("packed_linear_calls")
    return _packed_linear(x, packed, bias)
