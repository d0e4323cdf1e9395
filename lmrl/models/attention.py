"""SDPA attention that runs in fp32 under CPU autocast.

Under ``torch.autocast("cpu", torch.bfloat16)`` PyTorch runs ``scaled_dot_product_attention`` in bf16, and on CPUs
without AMX its bf16 kernels are several times slower than fp32 for the shapes of small models (measured on an AMD
EPYC with AVX512-BF16, 8 heads of 48: one decode step at 64 rows x 50 cached positions 1.09 ms bf16 vs 0.25 ms fp32;
forward+backward at 64 x 32 queries x 57 keys 39 ms vs 14 ms). Llama-style RoPE also leaves keys in fp32, so autocast
re-casts the whole KV cache to bf16 at every decode step. ``lmrl_sdpa`` is HF's ``sdpa`` attention with the
inputs upcast to fp32 and autocast off inside it, on CPU under autocast only; everywhere else it *is* ``sdpa``.
Matmuls of the projections and MLP stay under autocast.

Grouped-query attention on CPU (several queries per key/value head, e.g. SmolLM2's 9 query heads on 3 key/value
heads): with an attention mask HF repeats the keys and values to every query head (``repeat_kv``) before the kernel,
so a training forward keeps the repeated copies for the backward. For several query positions ``lmrl_sdpa`` lets the
kernel group the heads itself (``enable_gqa``; PyTorch's CPU flash kernel takes it with a mask): the same output
(measured equal), and at 32 rows x 63 queries x 108 keys, 9/3 heads of 64, fp32, it saves 10 MiB of the tensors kept
for the backward per layer (24.9 -> 14.8 MiB) and runs forward+backward in 42 instead of 54 ms. Decoding (one query)
keeps HF's own grouping (``pack_gqa``).
"""

from __future__ import annotations

import contextlib

import torch
from packaging.version import Version
from transformers import AttentionInterface
from transformers.integrations import sdpa_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from lmrl.models.rebuild import rebuildable

NAME = "lmrl_sdpa"
KERNEL_GQA = hasattr(sdpa_attention, "use_gqa_in_sdpa") and Version(torch.__version__.split("+")[0]) >= Version("2.5")
"""PyTorch's sdpa takes ``enable_gqa`` (>= 2.5), and HF decides it in ``use_gqa_in_sdpa``."""


def sdpa_fp32_on_cpu(module, query, key, value, attention_mask, **kwargs):
    """HF ``sdpa_attention_forward``; on CPU under autocast, computed in fp32 (same math, more precise); on CPU with
    several query positions, grouped-query heads grouped by the kernel (``enable_gqa``) rather than repeated."""
    if query.device.type != "cpu":
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    with kernel_gqa() if query.shape[2] > 1 and KERNEL_GQA else contextlib.nullcontext():
        if torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                query, key, value = (
                    rebuildable(t.float(), torch.Tensor.float, t, name="attention_input") for t in (query, key, value)
                )
                return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


@contextlib.contextmanager
def kernel_gqa():
    """Within the block HF's sdpa passes ``enable_gqa=True`` to the kernel for grouped-query attention, instead of
    repeating keys and values whenever there is a mask (what its ``use_gqa_in_sdpa`` decides for CPU tensors)."""
    decide = sdpa_attention.use_gqa_in_sdpa
    sdpa_attention.use_gqa_in_sdpa = lambda *args, **kwargs: True
    try:
        yield
    finally:
        sdpa_attention.use_gqa_in_sdpa = decide


AttentionInterface.register(NAME, sdpa_fp32_on_cpu)
AttentionMaskInterface.register(NAME, sdpa_mask)  # an attention name without a mask function gets *no* mask in HF


def use_fp32_cpu_attention(model) -> None:
    """Switch a model that uses HF ``sdpa`` to ``lmrl_sdpa`` (no-op for eager, flash or other implementations).

    The choice lives in ``config._attn_implementation``, which ``save_pretrained`` does not write, so saved
    checkpoints load anywhere with their usual attention.
    """
    hf_config = getattr(model, "config", None)  # transformers' config
    if getattr(hf_config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(NAME)
