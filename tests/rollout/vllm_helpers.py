"""What the vLLM engine tests share: the import guard, the prompts and tiny fp32 models made in the test."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from tests.helpers import tiny_llama

TOL = 1e-4
TEXTS = ["12+34=", "hello world", "The cat sat on", "7*8="]


def require_vllm() -> None:
    """Skip the module without vLLM; under `make test-vllm` (LMRL_REQUIRE_VLLM=1) a missing vLLM fails instead."""
    if os.environ.get("LMRL_REQUIRE_VLLM"):
        import vllm  # noqa: F401
    else:
        pytest.importorskip("vllm")


def tiny(arch: str, vocab: int, seed: int = 0):
    """A 2-layer fp32 model in eval mode: ``llama`` (head size 32, untied LM head) or ``qwen2`` (head size 64,
    tied LM head: on CPU its prepacked copy must be re-packed after a sync)."""
    if arch == "llama":
        return tiny_llama(
            vocab, seed, hidden_size=128, intermediate_size=256, max_position_embeddings=256, tie_word_embeddings=False
        )
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=256,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).eval()


def tiny_moe(arch: str, vocab: int, seed: int = 0):
    """A 2-layer fp32 mixture-of-experts model in eval mode (4 experts, top 2, head size 64, untied head):
    ``qwen3_moe`` (transformers keeps its experts fused in memory as `mlp.experts.gate_up_proj`) or ``mixtral``
    (checkpoint names `block_sparse_moe.experts.N.w1`, which differ from the in-memory ones). Expert width 64, a
    multiple of the CPU kernel's 32-wide blocks."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=256,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    if arch == "qwen3_moe":
        return Qwen3MoeForCausalLM(
            Qwen3MoeConfig(**common, intermediate_size=256, moe_intermediate_size=64, num_experts=4)
        ).eval()
    return MixtralForCausalLM(MixtralConfig(**common, intermediate_size=64, num_local_experts=4)).eval()


def char_prompts(tok) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
