"""engine=vllm with a LoRA (peft) policy, on vLLM's CPU build (`make test-vllm`): the engine samples the MERGED
model (W + (alpha/r) B A, pushed after each step), so its greedy output and log-probs equal the merged HF model's.

One module-scoped engine on a tiny Llama with LoRA on every linear layer; each test compares with
`merge_and_unload()` of a copy of the peft model as it is at that moment.
"""

import copy

import pytest
import torch
from vllm_helpers import TEXTS, TOL, char_prompts, require_vllm, tiny  # noqa: E402,F401

require_vllm()
pytest.importorskip("peft")

from lmrl.models.forward_plan import ForwardPlan, completion_logprobs  # noqa: E402
from lmrl.models.lora import apply_lora  # noqa: E402
from lmrl.rollout import HFEngine, SamplingParams  # noqa: E402
from lmrl.rollout.engines.vllm.engine import VLLMEngine, VLLMOptions  # noqa: E402

pytestmark = pytest.mark.vllm
GREEDY = SamplingParams(max_new_tokens=20, greedy=True, temperature=0)


@pytest.fixture(scope="module")
def lora_engine(tok):
    """(peft model with LoRA on every linear layer, a VLLMEngine sampling from it)."""
    model = apply_lora(
        tiny("llama", len(tok)),
        r=4,
        alpha=8,
        dropout=0.0,
        targets=["all-linear"],
        base={"model": "test", "seed": 0, "model_args": {}},
    )
    engine = VLLMEngine(model, tok, VLLMOptions(max_model_len=128, kv_cache_gb=0.0625, seed=0))
    yield model, engine
    del engine


def merged(model):
    """The HF model the peft model computes now: W + (alpha/r) B A, adapters gone."""
    return copy.deepcopy(model).merge_and_unload().eval()


def assert_engine_samples(engine, model, prompts, tok):
    """Greedy batch equal to the merged HF model's (tokens, texts), log-probs within TOL; sampled log-probs equal
    the merged model's teacher-forced ones."""
    reference = merged(model)
    want, got = HFEngine(reference, tok).generate(prompts, GREEDY), engine.generate(prompts, GREEDY)
    assert torch.equal(want.completion_ids, got.completion_ids) and want.completions == got.completions
    assert (want.sampler_logp - got.sampler_logp).abs().max().item() < TOL
    sampled = engine.generate(
        prompts, SamplingParams(max_new_tokens=12, temperature=0.8), n=3, generator=torch.Generator().manual_seed(5)
    )
    learner = completion_logprobs(
        reference, sampled.input_ids, sampled.attention_mask, sampled.prompt_ids.shape[1], ForwardPlan(temperature=0.8)
    )  # (N, T)
    assert ((learner - sampled.sampler_logp) * sampled.completion_mask).abs().max().item() < TOL


def test_a_lora_step_is_pushed_as_merged_weights(lora_engine, prompts, tok):
    model, engine = lora_engine
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    before = engine.generate(prompts, GREEDY)
    for step in range(2):  # real LoRA steps: B moves off zero, so the merged weights differ from the base
        batch = engine.generate(
            prompts,
            SamplingParams(max_new_tokens=12, temperature=1.0),
            n=2,
            generator=torch.Generator().manual_seed(step),
        )
        logp = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1])
        (-(logp * batch.completion_mask).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
        engine.sync(model, (engine.version or 0) + 1)  # what the trainer does before its next rollout
        assert engine.stale
    after = engine.generate(prompts, GREEDY)
    assert (
        not torch.equal(before.completion_ids, after.completion_ids)
        or (before.sampler_logp - after.sampler_logp).abs().max() > 0.05
    )  # the steps changed the policy visibly
    assert_engine_samples(engine, model, prompts, tok)


def test_the_push_leaves_the_adapters_unmerged(lora_engine, prompts, tok):
    model, engine = lora_engine
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "base_layer" in n}
    engine.sync(model, (engine.version or 0) + 1)
    assert_engine_samples(engine, model, prompts, tok)
    for n, p in model.named_parameters():  # merge_adapter/unmerge_adapter restored every base weight
        if n in base_before:
            assert (p - base_before[n]).abs().max().item() < 1e-5, n


def test_adapter_sync_samples_the_lora_policy_and_pushes_the_base_weights_once(tok, prompts):
    # vllm_lora_sync=adapter: vLLM serves the adapter itself (enable_lora); after each step only the adapter goes
    model = apply_lora(
        tiny("llama", len(tok), seed=1),
        r=4,
        alpha=8,
        dropout=0.0,
        targets=["all-linear"],
        base={"model": "test", "seed": 1, "model_args": {}},
    )
    engine = VLLMEngine(model, tok, VLLMOptions(max_model_len=128, kv_cache_gb=0.0625, seed=0, lora_rank=8))
    pushes, push = [], engine.driver.load_weights
    engine.driver.load_weights = lambda weights, tied: (pushes.append(1), push(weights, tied))[1]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    before = engine.generate(prompts, GREEDY)
    for step in range(2):  # real LoRA steps: B moves off zero
        batch = engine.generate(
            prompts,
            SamplingParams(max_new_tokens=12, temperature=1.0),
            n=2,
            generator=torch.Generator().manual_seed(step),
        )
        logp = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1])
        (-(logp * batch.completion_mask).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
        engine.sync(model, (engine.version or 0) + 1)
    after = engine.generate(prompts, GREEDY)
    assert (
        not torch.equal(before.completion_ids, after.completion_ids)
        or (before.sampler_logp - after.sampler_logp).abs().max() > 0.05
    )  # the steps changed the policy visibly
    assert_engine_samples(engine, model, prompts, tok)
    assert len(pushes) == 1 and engine.driver.adapters == engine.syncs == 3  # base once; an adapter every sync
