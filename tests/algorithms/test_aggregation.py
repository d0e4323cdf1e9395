"""Tests for lmrl.algorithms.aggregation (hand values in comments)."""

import pytest
import torch

from lmrl.algorithms import aggregate, masked_mean

NAN, INF = float("nan"), float("inf")


def _example():
    # row 0: 4 tokens [1, 2, 3, 4] -> sum 10, mean 2.5
    # row 1: 2 tokens [10, 20] -> sum 30, mean 15; its padding holds NaN and inf
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, NAN, INF]], requires_grad=True)
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    return x, m


@pytest.mark.parametrize(
    "mode, max_len, want",
    [
        ("token_mean", None, 40 / 6),  # (10 + 30) / 6 tokens = 6.666667
        ("seq_mean", None, 8.75),  # (2.5 + 15) / 2
        ("seq_sum_norm", None, 5.0),  # (10 + 30) / (2 rows * T=4)
        ("seq_sum_norm", 10, 2.0),  # (10 + 30) / (2 rows * 10)
        ("token_mean", 10, 40 / 6),  # max_len only matters for seq_sum_norm
    ],
)
def test_modes_on_unequal_lengths(mode, max_len, want):
    x, m = _example()
    assert aggregate(x, m, mode, max_len).item() == pytest.approx(want, abs=1e-6)


def test_gradients_weight_tokens_per_mode_and_ignore_padding():
    # d/dx: token_mean 1/6 per token; seq_mean 1/(2*4) on row 0 and 1/(2*2) on row 1;
    # seq_sum_norm 1/(2*4) everywhere real; always 0 (never NaN) on padding
    want = {
        "token_mean": [[1 / 6] * 4, [1 / 6, 1 / 6, 0, 0]],
        "seq_mean": [[1 / 8] * 4, [1 / 4, 1 / 4, 0, 0]],
        "seq_sum_norm": [[1 / 8] * 4, [1 / 8, 1 / 8, 0, 0]],
    }
    for mode, grad in want.items():
        x, m = _example()
        aggregate(x, m, mode).backward()
        torch.testing.assert_close(x.grad, torch.tensor(grad), atol=1e-7, rtol=0)


def test_empty_rows_contribute_zero():
    # add row 2 with no tokens (value 7 everywhere, masked out)
    # token_mean 40/6; seq_mean (2.5 + 15 + 0)/3 = 5.833333; seq_sum_norm 40 / (3*4) = 3.333333
    x, m = _example()
    x3 = torch.cat([x.detach(), torch.full((1, 4), 7.0)])
    m3 = torch.cat([m, torch.zeros(1, 4, dtype=m.dtype)])
    assert aggregate(x3, m3, "token_mean").item() == pytest.approx(40 / 6, abs=1e-6)
    assert aggregate(x3, m3, "seq_mean").item() == pytest.approx(17.5 / 3, abs=1e-6)
    assert aggregate(x3, m3, "seq_sum_norm").item() == pytest.approx(40 / 12, abs=1e-6)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean", "seq_sum_norm"])
def test_all_empty_mask_gives_zero(mode):
    assert aggregate(torch.full((2, 3), NAN), torch.zeros(2, 3), mode).item() == 0.0


def test_bool_and_float_masks_agree():
    x, m = _example()
    assert aggregate(x, m.bool()).item() == aggregate(x, m.float()).item()


def test_masked_mean():
    x, m = _example()
    assert masked_mean(x, m).item() == pytest.approx(40 / 6, abs=1e-6)
    assert masked_mean(x, torch.zeros(2, 4)).item() == 0.0


def test_bad_input():
    x, m = _example()
    with pytest.raises(ValueError, match="Did you mean 'seq_mean'"):
        aggregate(x, m, "seq_meen")
    with pytest.raises(ValueError, match="shape"):
        aggregate(x, m[:, :3])
    with pytest.raises(ValueError, match="only 0 and 1"):
        aggregate(x, m * 0.5)
    with pytest.raises(ValueError, match="max_len"):
        aggregate(x, m, "seq_sum_norm", max_len=0)
    with pytest.raises(ValueError, match=r"\(N, T\)"):
        aggregate(torch.zeros(4), torch.ones(4))
    with pytest.raises(ValueError, match=r"\(N, T\)"):
        aggregate(torch.zeros(0, 3), torch.ones(0, 3))
