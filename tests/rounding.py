"""Rounding in tests. Noise on demand: what another CPU's kernels, thread count or batch layout do to a model's outputs.

`add_rounding_noise(module, relative)` makes every forward of ``module`` add relative * scale * z to its output
(scale: the row's max |output|; z ~ N(0, 1), fresh at every call, as two runs of an fp32 GEMM differ on a CPU whose
kernels split rows by the batch layout: a matmul's rounding error scales with |x| |w|, not with each output): the start-up checks must accept a model whose outputs differ only by such noise. The relative 1e-5
used by the tests is ~170 fp32 roundoffs, 2.5e-4 at a logit of 25: above the 1e-4 the checks once allowed, below
what their rounding bounds derive.
"""

import torch

RELATIVE = 1e-5


def add_rounding_noise(module: torch.nn.Module, relative: float = RELATIVE, seed: int = 0):
    """Register the noise on ``module``'s output; returns the hook's handle (``.remove()`` takes it off)."""
    generator = torch.Generator().manual_seed(seed)

    def noisy(_module, _inputs, output):
        z = torch.randn(output.shape, generator=generator).to(output.device, output.dtype)
        return output + relative * output.abs().amax(-1, keepdim=True) * z

    return module.register_forward_hook(noisy)


def assert_trained_alike(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], ulps: float = 8) -> None:
    """Two runs' final weights (name -> tensor) are the same training up to fp32 rounding: within ``ulps``
    roundoffs of the weights' scale. For runs made with adam_eps=1, whose update lr * m / (sqrt(v) + 1) is linear in
    the gradient; AdamW's default eps (1e-8) turns a near-zero gradient's rounding into up to a whole step of lr (1e-4
    after 2 steps of lr 1e-2, measured on an AMD EPYC), which no rounding bound can hold."""
    from lmrl.numerics import agreement, rounding_bound

    assert a.keys() == b.keys()
    flat_a, flat_b = (torch.cat([w[k].detach().flatten().float() for k in sorted(w)]) for w in (a, b))
    outcome = agreement(flat_b, flat_a, rounding_bound(flat_a, [], dtype=torch.float32, floor_ulps=ulps))
    assert outcome, f"the runs trained differently: {outcome}"


def assert_grads_alike(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], model, dtype=torch.bfloat16) -> None:
    """Two computations' gradients (name -> tensor) agree per tensor within `lmrl.numerics.model_ulps` roundoffs of
    ``dtype`` of the tensor's scale (sqrt(hidden) * layers; bf16: 6% of the scale for a 2-layer, 64-wide model,
    where the replayed and the computed bf16 forwards differ by 0.3-0.7% on AVX2 and AVX-512 kernels)."""
    from lmrl.numerics import agreement, model_ulps, rounding_bound

    assert a.keys() == b.keys()
    for name, expected in b.items():
        bound = rounding_bound(expected.float(), [], dtype=dtype, floor_ulps=model_ulps(model))
        outcome = agreement(a[name].float(), expected.float(), bound)
        assert outcome, f"{name}: {outcome}"
