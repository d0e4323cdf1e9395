"""precision=auto: bf16 autocast where bf16 matmuls are measured faster."""

import pytest
import torch

from lmrl.models import precision


def test_fixed_settings():
    assert precision.autocast_dtype("fp32") is None
    assert precision.autocast_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="auto, bf16 or fp32"):
        precision.autocast_dtype("fp16")


@pytest.mark.parametrize("speedup, expected", [(0.6, None), (1.1, None), (2.5, torch.bfloat16)])
def test_auto_follows_the_cpu_probe(monkeypatch, speedup, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(precision, "cpu_bf16_speedup", lambda: speedup)
    assert precision.autocast_dtype("auto", "cpu") is expected


def test_amx_means_bf16_without_probing(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setattr(precision, "cpu_bf16_speedup", lambda: pytest.fail("probed despite AMX"))
    assert precision.autocast_dtype("auto", "cpu") is torch.bfloat16


def test_probe_measures_a_positive_ratio_once():
    first = precision.cpu_bf16_speedup()
    assert first > 0 and precision.cpu_bf16_speedup() == first  # cached: one measurement per process
