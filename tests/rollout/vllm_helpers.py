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

from lmrl.models.forward_plan import ForwardPlan, completion_logprobs
from lmrl.rollout import HFEngine, SamplingParams
from tests.helpers import tiny_llama

TOL = 1e-4
TEXTS = ["12+34=", "hello world", "The cat sat on", "7*8="]
WIDE = dict(hidden_size=128, num_hidden_layers=2, max_position_embeddings=256)
"""Every model here: 2 layers of width 128, 256 positions."""
HEADS_OF_64 = dict(num_attention_heads=2, num_key_value_heads=1)
"""The Qwen2 and MoE models' attention: 2 heads of 64 sharing one KV head."""


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
        return tiny_llama(vocab, seed, **WIDE, intermediate_size=256, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(
        Qwen2Config(vocab_size=vocab, **WIDE, **HEADS_OF_64, intermediate_size=256, tie_word_embeddings=True)
    ).eval()


def tiny_moe(arch: str, vocab: int, seed: int = 0):
    """A 2-layer fp32 mixture-of-experts model in eval mode (4 experts, top 2, head size 64, untied head):
    ``qwen3_moe`` (transformers keeps its experts fused in memory as `mlp.experts.gate_up_proj`) or ``mixtral``
    (checkpoint names `block_sparse_moe.experts.N.w1`, which differ from the in-memory ones). Expert width 64, a
    multiple of the CPU kernel's 32-wide blocks."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab, **WIDE, **HEADS_OF_64, head_dim=64, num_experts_per_tok=2, tie_word_embeddings=False
    )
    if arch == "qwen3_moe":
        return Qwen3MoeForCausalLM(
            Qwen3MoeConfig(**common, intermediate_size=256, moe_intermediate_size=64, num_experts=4)
        ).eval()
    return MixtralForCausalLM(MixtralConfig(**common, intermediate_size=64, num_local_experts=4)).eval()


def assert_samples_the_model(model, engine, prompts, tok, greedy, temperature=0.8, n=3, seed=5):
    """The engine's greedy batch equals the HF model's (tokens, texts; log-probs within TOL), and the log-probs of its
    sampled batch (``n`` per prompt at ``temperature``) equal the model's teacher-forced ones within TOL. Returns
    (HF greedy batch, engine greedy batch, sampled batch)."""
    want, got = HFEngine(model, tok).generate(prompts, greedy), engine.generate(prompts, greedy)
    assert torch.equal(want.completion_ids, got.completion_ids) and want.completions == got.completions
    assert (want.sampler_logp - got.sampler_logp).abs().max().item() < TOL
    params = SamplingParams(max_new_tokens=12, temperature=temperature)
    sampled = engine.generate(prompts, params, n=n, generator=torch.Generator().manual_seed(seed))
    plan, start = ForwardPlan(temperature=temperature), sampled.prompt_ids.shape[1]
    learner = completion_logprobs(model, sampled.input_ids, sampled.attention_mask, start, plan)  # (N, T)
    gap = ((learner - sampled.sampler_logp) * sampled.completion_mask).abs().max().item()
    assert gap < TOL, gap
    return want, got, sampled


def train_on_samples(model, engine, prompts, optimizer, seed: int) -> None:
    """One optimizer step that raises the log-probs of the engine's samples (2 a prompt at temperature 1), then the
    sync a trainer does before its next rollout."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    batch = engine.generate(prompts, params, n=2, generator=torch.Generator().manual_seed(seed))
    logp = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1])
    (-(logp * batch.completion_mask).sum()).backward()
    optimizer.step()
    optimizer.zero_grad()
    engine.sync(model, (engine.version or 0) + 1)


def char_prompts(tok) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
