"""precision=auto: bf16 autocast where the device has bf16 matmuls in hardware (CUDA bf16, CPU AMX), never timed."""

import pytest
import torch

from lmrl.models import precision


def test_fixed_settings():
    assert precision.autocast_dtype("fp32") is None
    assert precision.autocast_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="auto, bf16 or fp32"):
        precision.autocast_dtype("fp16")


@pytest.mark.parametrize("amx, expected", [(False, None), (True, torch.bfloat16)])
def test_auto_on_a_cpu_follows_amx_alone(monkeypatch, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert precision.autocast_dtype("auto", "cpu") is expected


def test_auto_does_not_depend_on_how_busy_the_machine_is(monkeypatch):
    """No timing decides it: with every clock slowed down a thousandfold, auto says the same."""
    import time

    before = precision.autocast_dtype("auto", "cpu")
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() * 1000)
    assert precision.autocast_dtype("auto", "cpu") is before
    assert not hasattr(precision, "cpu_bf16_speedup")
