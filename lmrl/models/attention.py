"""SDPA attention that runs in fp32 under CPU autocast.

Under ``torch.autocast("cpu", torch.bfloat16)`` PyTorch runs ``scaled_dot_product_attention`` in bf16, and on CPUs
without AMX its bf16 kernels are several times slower than fp32 for the shapes of small models (measured on an AMD
EPYC with AVX512-BF16, 8 heads of 48: one decode step at 64 rows x 50 cached positions 1.09 ms bf16 vs 0.25 ms fp32;
forward+backward at 64 x 32 queries x 57 keys 39 ms vs 14 ms). Llama-style RoPE also leaves keys in fp32, so autocast
re-casts the whole KV cache to bf16 at every decode step. ``lmrl_sdpa`` is HF's ``sdpa`` attention with the
inputs upcast to fp32 and autocast off inside it, on CPU under autocast only; everywhere else it *is* ``sdpa``.
Matmuls of the projections and MLP stay under autocast.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "lmrl_sdpa"


def sdpa_fp32_on_cpu(module, query, key, value, attention_mask, **kwargs):
    """HF ``sdpa_attention_forward``; on CPU under autocast, computed in fp32 (same math, more precise)."""
    if query.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            return sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(NAME, sdpa_fp32_on_cpu)
AttentionMaskInterface.register(NAME, sdpa_mask)  # an attention name without a mask function gets *no* mask in HF


def use_fp32_cpu_attention(model) -> None:
    """Switch a model that uses HF ``sdpa`` to ``lmrl_sdpa`` (no-op for eager, flash or other implementations).

    The choice lives in ``config._attn_implementation``, which ``save_pretrained`` does not write, so saved
    checkpoints load anywhere with their usual attention.
    """
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(NAME)
