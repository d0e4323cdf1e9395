"""What the vLLM engine tests share: the import guard, the prompts and tiny fp32 models made in the test."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

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
    torch.manual_seed(seed)
    if arch == "llama":
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=256, max_position_embeddings=256,
                          tie_word_embeddings=False)
        return LlamaForCausalLM(cfg).eval()
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=256, max_position_embeddings=256,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def char_prompts(tok) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
