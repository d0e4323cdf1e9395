"""engine=vllm with a LoRA (peft) policy, on vLLM's CPU build (`make test-vllm`): the engine samples the MERGED
model (W + (alpha/r) B A, pushed after each step), so its greedy output and log-probs equal the merged HF model's.

One module-scoped engine on a tiny Llama with LoRA on every linear layer; each test compares with
`merge_and_unload()` of a copy of the peft model as it is at that moment.
"""

import copy

import pytest
import torch
from vllm_helpers import assert_samples_the_model, require_vllm, tiny, train_on_samples

require_vllm()
pytest.importorskip("peft")

from lmrl.models.lora import apply_lora  # noqa: E402
from lmrl.rollout import SamplingParams  # noqa: E402
from lmrl.rollout.engines.vllm.engine import VLLMEngine, VLLMOptions  # noqa: E402

pytestmark = pytest.mark.vllm
GREEDY = SamplingParams(max_new_tokens=20, greedy=True, temperature=0)


def lora_policy(tok, seed: int):
    """The tiny Llama of ``seed`` with rank-4 LoRA on every linear layer (B = 0: the base's outputs)."""
    base = {"model": "test", "seed": seed, "model_args": {}}
    return apply_lora(tiny("llama", len(tok), seed=seed), r=4, alpha=8, dropout=0.0, targets=["all-linear"], base=base)


def take_two_lora_steps(model, engine, prompts) -> list[bool]:
    """Two real LoRA steps on the engine's samples, each pushed (B moves off zero, so the merged weights differ from
    the base); they change the greedy policy visibly. Returns whether the engine was stale after each push."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    before, stale = engine.generate(prompts, GREEDY), []
    for step in range(2):
        train_on_samples(model, engine, prompts, optimizer, seed=step)
        stale.append(engine.stale)
    after = engine.generate(prompts, GREEDY)
    assert (
        not torch.equal(before.completion_ids, after.completion_ids)
        or (before.sampler_logp - after.sampler_logp).abs().max() > 0.05
    )  # the steps changed the policy visibly
    return stale


@pytest.fixture(scope="module")
def lora_engine(tok):
    """(peft model with LoRA on every linear layer, a VLLMEngine sampling from it)."""
    model = lora_policy(tok, seed=0)
    engine = VLLMEngine(model, tok, VLLMOptions(max_model_len=128, kv_cache_gb=0.0625, seed=0))
    yield model, engine
    del engine


def merged(model):
    """The HF model the peft model computes now: W + (alpha/r) B A, adapters gone."""
    return copy.deepcopy(model).merge_and_unload().eval()


def test_a_lora_step_is_pushed_as_merged_weights(lora_engine, prompts, tok):
    model, engine = lora_engine
    assert all(take_two_lora_steps(model, engine, prompts))
    assert_samples_the_model(merged(model), engine, prompts, tok, GREEDY)


def test_the_push_leaves_the_adapters_unmerged(lora_engine, prompts, tok):
    model, engine = lora_engine
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "base_layer" in n}
    engine.sync(model, (engine.version or 0) + 1)
    assert_samples_the_model(merged(model), engine, prompts, tok, GREEDY)
    for n, p in model.named_parameters():  # merge_adapter/unmerge_adapter restored every base weight
        if n in base_before:
            assert (p - base_before[n]).abs().max().item() < 1e-5, n


def test_adapter_sync_samples_the_lora_policy_and_pushes_the_base_weights_once(tok, prompts):
    # vllm_lora_sync=adapter: vLLM serves the adapter itself (enable_lora); after each step only the adapter goes
    model = lora_policy(tok, seed=1)
    engine = VLLMEngine(model, tok, VLLMOptions(max_model_len=128, kv_cache_gb=0.0625, seed=0, lora_rank=8))
    pushes, push = [], engine.driver.load_weights
    engine.driver.load_weights = lambda weights, tied: (pushes.append(1), push(weights, tied))[1]
    take_two_lora_steps(model, engine, prompts)
    assert_samples_the_model(merged(model), engine, prompts, tok, GREEDY)
    assert len(pushes) == 1 and engine.driver.adapters == engine.syncs == 3  # base once; an adapter every sync
