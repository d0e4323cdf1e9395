"""Mixture-of-experts models through the vLLM engine (vLLM's CPU build, `make test-vllm`): after changing every
weight and syncing in place, the engine samples the changed model.

Two tiny random models made here, vocab_size == len(tokenizer), head size 64:
- Qwen3-MoE: on CPU vLLM prepacks the experts at load time only; without the re-pack after each reload
  (`vllm_weights.install_moe_repack`) the engine runs on raw expert weights and its log-probs are off by ~1-6
  (measured; this test then fails).
- Mixtral: transformers 5 names its experts differently in memory (`mlp.experts.gate_up_proj`) than its checkpoints
  (`block_sparse_moe.experts.N.w1`); pushing the in-memory names crashed vLLM's loader at the first push.
"""

import pytest
import torch
from vllm_helpers import assert_samples_the_model, require_vllm, tiny_moe  # noqa: E402

require_vllm()

from lmrl.rollout import HFEngine, SamplingParams  # noqa: E402
from lmrl.rollout.engines.vllm.engine import VLLMEngine, VLLMOptions  # noqa: E402
from lmrl.rollout.engines.vllm.weights import hf_weights  # noqa: E402

pytestmark = pytest.mark.vllm
GREEDY = SamplingParams(max_new_tokens=16, greedy=True, temperature=0)


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def moe(request, tok):
    model = tiny_moe(request.param, len(tok))
    engine = VLLMEngine(model, tok, VLLMOptions(max_model_len=128, kv_cache_gb=0.0625, seed=0))
    yield model, engine
    del engine


def perturb(model, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def test_pushed_names_are_the_checkpoints_per_expert_names(moe):
    model, _ = moe
    names = [name for name, _ in hf_weights(model)]
    assert not any("gate_up_proj" in n for n in names)  # no fused in-memory expert tensor
    expert = (
        "block_sparse_moe.experts.3.w1.weight"
        if "Mixtral" in type(model).__name__
        else "mlp.experts.3.gate_proj.weight"
    )
    assert f"model.layers.1.{expert}" in names


def test_an_moe_model_samples_its_new_weights_after_every_sync(moe, prompts, tok):
    model, engine = moe
    assert engine.driver.moe_layers == 2  # the CPU experts of both layers re-pack after a reload
    assert_samples_the_model(model, engine, prompts, tok, GREEDY)  # the first push (dummy weights -> the model's)
    for i in range(2):  # each sync repacks once: a second pack of packed weights would be wrong
        old = HFEngine(model, tok).generate(prompts, GREEDY)
        perturb(model, 0.2, seed=10 + i)
        engine.sync(model, (engine.version or 0) + 1)
        new = HFEngine(model, tok).generate(prompts, GREEDY)
        assert (old.sampler_logp - new.sampler_logp).abs().max() > 0.1  # the change is visible
        assert_samples_the_model(model, engine, prompts, tok, GREEDY)
