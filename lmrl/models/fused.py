"""Fused RMSNorm, SwiGLU and tanh-GELU for HF decoders: the same values, fewer saved activations and fewer ops.

HF's RMSNorm (Llama, Qwen2/3, Mistral, SmolLM2, ...) runs six autograd ops and keeps its fp32 normalized output
for the backward; SwiGLU's ``act_fn(gate) * up`` keeps ``silu(gate)``. Here each is one `torch.autograd.Function`
that keeps only its inputs (and RMSNorm's per-row 1/rms) and writes the backward out:

    RMSNorm  y = w * cast(n),  n = x r,  r = 1 / sqrt(mean(x^2) + eps)           (x in fp32; cast: to x's dtype)
             dw = sum_rows dy * cast(n),   dx = r (g - n mean(g n)),  g = dy w   (Zhang & Sennrich 2019)
    SwiGLU   s = silu(a) * b,  silu(a) = a sigmoid(a)
             da = ds b sigmoid(a) (1 + a (1 - sigmoid(a))),   db = ds silu(a)   (PyTorch's silu_backward)

as Liger-Kernel fuses them on GPUs. On SmolLM2-135M (30 layers, 2 norms and 1 MLP each) that is ~7 KB fewer saved
bytes per token and layer, ~1/3 of the training forward's activations (docs/benchmarks.md). GPT-2's
``NewGELUActivation`` writes the tanh GELU 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as seven autograd ops
keeping four tensors; ``F.gelu(x, approximate="tanh")`` is the same formula in one kernel that keeps x only.

Their outputs are registered with `lmrl.models.rebuild`: where the next layer's backward would keep SwiGLU's output
(the down projection's input) or a cast of the norm's output (the projections' bf16 input), it rebuilds it from
the tensors these functions keep anyway.

`fuse_layers(model)` swaps a module's forward only after the fused one reproduced the module's own output on a
random input in the module's dtype (Gemma's ``1 + w`` norm, OLMo's order of operations and any other variant
fail that check and keep their own forward), and returns what it fused; each fused forward that runs is counted (`lmrl.models.usage`: ``fused_<kind>``; the
metric that says they ran is this count, never the setting).
"""

from __future__ import annotations

import functools
import math
import types

import torch
import torch.nn.functional as F

from lmrl.models import usage
from lmrl.models.rebuild import rebuildable
from lmrl.notices import model_name, switched_off
from lmrl.numerics import Agreement, agreement, rounding_bound

__all__ = [
    "RMSNormFunction",
    "SwiGLUFunction",
    "fuse_layers",
    "fused_count",
    "fusion_candidate",
]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's Llama RMSNorm, op for op: w * (x r).to(x.dtype), r = rsqrt(mean(x^2) + eps), x in fp32."""
    xf = x.to(torch.float32)
    return weight * (xf * rms_inverse(xf, eps)).to(x.dtype)


def rms_inverse(xf: torch.Tensor, eps: float) -> torch.Tensor:
    """r = 1 / sqrt(mean(x^2, -1) + eps), (..., 1)."""
    return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b."""
    return F.silu(a) * b


class RMSNormFunction(torch.autograd.Function):
    """y = w * (x r).to(x.dtype), r = rsqrt(mean(x^2, -1) + eps) with x in fp32, exactly as HF's Llama RMSNorm;
    saves x, w and r (rows, 1) only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(torch.float32)
        r = rms_inverse(xf, eps)  # (..., 1)
        ctx.save_for_backward(x, weight, r)
        return weight * (xf * r).to(x.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, r = ctx.saved_tensors
        n = x.to(torch.float32) * r  # (..., H) fp32
        cast = n.to(x.dtype)
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy * cast).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        g = (dy * weight).to(x.dtype).to(torch.float32)  # the gradient of n, through HF's cast to x's dtype
        dx = r * (g - n * (g * n).mean(-1, keepdim=True))
        return dx.to(x.dtype), dw, None


class SwiGLUFunction(torch.autograd.Function):
    """s = silu(a) * b; saves a and b only: the backward recomputes silu(a) (one op) and applies PyTorch's own
    ``silu_backward`` kernel, so the gradients are autograd's, bit for bit."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return swiglu(a, b)

    @staticmethod
    def backward(ctx, ds: torch.Tensor):
        a, b = ctx.saved_tensors
        da = torch.ops.aten.silu_backward(ds * b, a) if ctx.needs_input_grad[0] else None
        db = ds * F.silu(a) if ctx.needs_input_grad[1] else None
        return da, db


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    usage.count("fused_rms_norm")
    y = RMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon)
    return rebuildable(
        y, functools.partial(rms_norm, eps=self.variance_epsilon), hidden_states, self.weight, name="rms_norm"
    )


def _swiglu_forward(self, x: torch.Tensor) -> torch.Tensor:
    usage.count("fused_swiglu")
    gate, up = self.gate_proj(x), self.up_proj(x)
    return self.down_proj(rebuildable(SwiGLUFunction.apply(gate, up), swiglu, gate, up, name="swiglu"))


def _gelu_tanh_forward(self, x: torch.Tensor) -> torch.Tensor:
    usage.count("fused_gelu_tanh")
    return F.gelu(x, approximate="tanh")


def _is_rms_norm(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(weight, torch.nn.Parameter)
        and weight.dim() == 1
        and isinstance(getattr(module, "variance_epsilon", None), float)
    )


def _is_swiglu(module: torch.nn.Module) -> bool:
    act = getattr(module, "act_fn", None)
    return (
        all(isinstance(getattr(module, name, None), torch.nn.Module) for name in ("gate_proj", "up_proj", "down_proj"))
        and act is not None
        and (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation")
    )


def _reproduces(module: torch.nn.Module, fused_forward, width: int) -> Agreement:
    """Whether ``fused_forward`` gives the module's own output on a random (2, 3, width) input of its dtype (fp32
    for a module without parameters, such as an activation), up to rounding: against the module's own forward in
    float64, the fused output may be off by at most `lmrl.numerics.MARGIN` times the module's own output's error,
    and sqrt(width) roundoffs of the output's scale (a reduction over ``width``); a variant it does not know (Gemma's
    ``1 + w``) is off by O(1)."""
    params = list(module.parameters())
    param = next((p for p in params if p.is_floating_point()), None)
    if params and param is None:  # quantized weights only: no dtype to test in
        return Agreement(math.inf, 0.0)
    device, dtype = (param.device, param.dtype) if param is not None else ("cpu", torch.float32)
    x = 3 * torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    as_double = {k: v.double() if v.is_floating_point() else v for k, v in _tensors(module).items()}
    with torch.no_grad():
        own = module(x)
        fused = fused_forward(module, x)
        exact = torch.func.functional_call(module, as_double, (x.double(),))
    return agreement(fused, exact, rounding_bound(exact, [own.double()], dtype=dtype, floor_ulps=width**0.5))


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def fusion_candidate(module: torch.nn.Module):
    """(kind, fused forward, input width) when ``module`` is a layer a fused version exists for, else None."""
    if _is_rms_norm(module):
        return "rms_norm", _rms_norm_forward, module.weight.shape[0]
    if _is_swiglu(module) and hasattr(module.gate_proj, "in_features"):
        return "swiglu", _swiglu_forward, module.gate_proj.in_features
    if type(module).__name__ == "NewGELUActivation":
        return "gelu_tanh", _gelu_tanh_forward, 64
    return None


def fuse_layers(model: torch.nn.Module) -> dict[str, int]:
    """Swap the forward of every RMSNorm, SwiGLU MLP and tanh GELU (GPT-2's ``NewGELUActivation``) of ``model`` that
    the fused version reproduces; returns how many of each were fused ({"rms_norm": n, "swiglu": m}, and
    "gelu_tanh" where there are any). Idempotent."""
    fused = {"rms_norm": 0, "swiglu": 0}
    failed: dict[str, tuple[int, Agreement]] = {}  # kind -> (modules that kept their own forward, the worst)
    for module in model.modules():
        if getattr(module, "lmrl_fused", None):
            fused[module.lmrl_fused] = fused.get(module.lmrl_fused, 0) + 1
            continue
        candidate = fusion_candidate(module)
        if candidate is None:
            continue
        kind, forward, width = candidate
        with usage.quiet():  # the check's own call is not a use
            outcome = _reproduces(module, forward, width)
        if outcome:
            module.forward = types.MethodType(forward, module)
            module.lmrl_fused = kind
            fused[kind] = fused.get(kind, 0) + 1
        else:
            count, worst = failed.get(kind, (0, outcome))
            failed[kind] = (count + 1, max(worst, outcome, key=lambda a: a.difference))
    for kind, (count, worst) in failed.items():
        switched_off(
            f"the fused {kind}",
            model_name(model),
            f"{count} of {count + fused.get(kind, 0)} modules keep their own forward: the fused output {worst} "
            "against the module's own in float64 (a variant the fused version does not compute; metric "
            "update/fused_calls counts the fused forwards that ran)",
        )
    return fused


def fused_count(model: torch.nn.Module) -> int:
    """How many modules of ``model`` run a fused forward."""
    return sum(1 for m in model.modules() if getattr(m, "lmrl_fused", None))
