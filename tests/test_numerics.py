"""`lmrl.numerics`: the rounding bounds every start-up check decides with, against values computed by hand."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmrl.numerics import Agreement, agreement, compute_dtype, matmul_bound, model_ulps, rounding_bound, unit_roundoff

pytestmark = pytest.mark.portable  # `make test-portable`: again under other CPU kernels and threads


def test_unit_roundoff_is_half_an_ulp_of_one():
    assert unit_roundoff(torch.float32) == 2.0**-24
    assert unit_roundoff(torch.bfloat16) == 2.0**-8
    assert unit_roundoff(torch.float64) == 2.0**-53


def test_matmul_bound_by_hand():
    # x = [1, -2], w = [[3, 4]]: |x||w|^T = 11, x w^T = -5; K = 2, u = 2^-24, gamma_2 = 2u / (1 - 2u)
    x, w = torch.tensor([[1.0, -2.0]]), torch.tensor([[3.0, 4.0]])
    u = 2.0**-24
    gamma = 2 * u / (1 - 2 * u)
    expected = 2 * (gamma * 11 + 2.0**-8 * 5)  # output rounded to bf16
    assert math.isclose(matmul_bound(x, w, torch.bfloat16).item(), expected, rel_tol=1e-12)


def test_matmul_bound_holds_for_another_summation_order():
    """Two fp32 sums of the same products in opposite orders stay inside the bound, elementwise."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 512, generator=g), torch.randn(32, 512, generator=g)
    products = x[:, None, :] * w[None]  # (16, 32, 512), each product rounded to fp32
    forward, backward = torch.zeros(16, 32), torch.zeros(16, 32)
    for k in range(512):  # fp32 additions, left to right and right to left
        forward, backward = forward + products[..., k], backward + products[..., 511 - k]
    assert not torch.equal(forward, backward)  # the orders do round differently
    assert bool(((forward.double() - backward.double()).abs() <= matmul_bound(x, w, torch.float32)).all())


def test_rounding_bound_is_the_margin_times_the_spread_or_the_floor():
    reference = torch.tensor([4.0, -2.0])
    again = torch.tensor([4.0, -2.0 + 1e-3])
    assert math.isclose(rounding_bound(reference, [again], dtype=torch.float32, floor_ulps=1), 8e-3, rel_tol=1e-4)
    floor = 100 * 2.0**-24 * 4.0  # 100 roundoffs of the scale, max |reference| = 4
    assert rounding_bound(reference, [reference], dtype=torch.float32, floor_ulps=100) == floor
    assert rounding_bound(reference, [], dtype=torch.float32, floor_ulps=100) == floor


def test_agreement_refuses_nan_and_other_shapes_and_says_by_how_much():
    assert agreement(torch.ones(3), torch.ones(3) + 1e-6, 1e-5)
    outcome = agreement(torch.ones(3), torch.ones(3) + 1e-3, 1e-5)
    assert not outcome and str(outcome) == "differs by 0.001, rounding allows 1e-05"
    assert not agreement(torch.tensor([float("nan")]), torch.tensor([0.0]), 1.0)
    assert not agreement(torch.ones(3), torch.ones(4), 1.0)
    assert isinstance(agreement(torch.ones(0), torch.ones(0), 0.0), Agreement) and agreement(
        torch.ones(0), torch.ones(0), 0.0
    )


def test_model_ulps_and_compute_dtype_read_the_model():
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4)
    )
    assert model_ulps(model) == 8 * 3  # sqrt(64) * 3 layers
    assert compute_dtype(model) == torch.float32
    with torch.autocast("cpu", torch.bfloat16):
        assert compute_dtype(model) == torch.bfloat16
    assert compute_dtype(model.to(torch.bfloat16)) == torch.bfloat16
