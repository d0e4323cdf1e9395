"""The vLLM engine against the HF engine and the learner, on vLLM's CPU build (`make test-vllm`).

Two tiny fp32 models made here: a Llama with an untied LM head and a Qwen2 with a tied one (on CPU a tied head keeps a
stale prepacked copy unless re-packed after a sync). Each test compares with what the HF model computes NOW, so the
tests that change weights prove the sync: greedy tokens equal the HF engine's, log-probs the learner's within 1e-4.
"""

import os
import random

import pytest
import torch
from vllm_helpers import TEXTS, TOL, char_prompts, require_vllm, tiny  # noqa: E402,F401

require_vllm()

from lmrl.models.forward_plan import ForwardPlan, completion_logprobs  # noqa: E402
from lmrl.rollout import HFEngine, SamplingParams  # noqa: E402
from lmrl.rollout.engines.vllm.engine import VLLMEngine, VLLMOptions  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tok):
    """(HF model, its HFEngine, a VLLMEngine on it, process side effects of starting the engine)."""
    model = tiny(request.param, len(tok))
    random.seed(1)
    before = (torch.get_rng_state(), random.getstate(), torch.get_num_threads())
    engine = VLLMEngine(model, tok, VLLMOptions(max_model_len=128, kv_cache_gb=0.0625, seed=0))
    after = (torch.get_rng_state(), random.getstate(), torch.get_num_threads())
    yield model, HFEngine(model, tok), engine, (before, after)
    del engine


def assert_same_batch(hf, vl, logp_tol=TOL):
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(hf, name), getattr(vl, name)), name
    assert (hf.finish_reason, hf.completions, hf.prompts) == (vl.finish_reason, vl.completions, vl.prompts)
    assert (hf.sampler_logp - vl.sampler_logp).abs().max().item() < logp_tol


def perturb(model, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_starting_the_engine_leaves_the_process_rngs_and_threads(pair):
    (rng0, py0, threads0), (rng1, py1, threads1) = pair[3]
    assert torch.equal(rng0, rng1) and py0 == py1 and threads0 == threads1


def test_greedy_equals_the_hf_engine_token_for_token(pair, prompts):
    model, hf, engine, _ = pair
    params = SamplingParams(max_new_tokens=24, greedy=True, temperature=0)
    assert_same_batch(hf.generate(prompts, params), engine.generate(prompts, params))


def test_sampled_log_probs_equal_the_learner_and_seeds_reproduce(pair, prompts):
    model, _, engine, _ = pair
    params = SamplingParams(max_new_tokens=16, temperature=0.7)
    batch = engine.generate(prompts, params, n=4, generator=torch.Generator().manual_seed(3))
    assert len(batch) == 16 and batch.group_size == 4 and batch.prompts[:4] == [TEXTS[0]] * 4
    learner = completion_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1], ForwardPlan(temperature=0.7)
    )  # (N, T)
    gap = ((learner - batch.sampler_logp) * batch.completion_mask).abs().max().item()
    assert gap < TOL, gap
    again = engine.generate(prompts, params, n=4, generator=torch.Generator().manual_seed(3))
    other = engine.generate(prompts, params, n=4, generator=torch.Generator().manual_seed(4))
    assert torch.equal(batch.completion_ids, again.completion_ids)
    assert not torch.equal(batch.completion_ids, other.completion_ids)
    assert len({tuple(r) for r in batch.completion_ids[:4].tolist()}) > 1  # the n children are distinct samples


def test_more_prompt_tokens_than_one_engine_step_takes_are_sampled_seeded(pair, tok):
    # 16 prompts x 8 samples x 100 prompt tokens > the 8192-token step budget: with chunked prefill a seeded request
    # whose prefill is split crashed vLLM's CPU backend
    model, _, engine, _ = pair
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, len(tok), (100,), generator=g).tolist() for _ in range(16)]
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    batch = engine.generate(prompts, params, n=8, generator=torch.Generator().manual_seed(1))
    assert len(batch) == 128
    learner = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1])
    assert ((learner - batch.sampler_logp) * batch.completion_mask).abs().max().item() < TOL


def test_stop_strings_and_stop_tokens_mean_what_they_mean_for_hf(pair, prompts, tok):
    _, hf, engine, _ = pair
    free = hf.generate(prompts, SamplingParams(max_new_tokens=24, greedy=True, temperature=0))
    stop_string = free.completions[0][5:7]  # occurs in row 0 (at least)
    stop_token = int(free.completion_ids[1, 3])
    params = SamplingParams(
        max_new_tokens=24, greedy=True, temperature=0, stop_strings=(stop_string,), stop_token_ids=(stop_token,)
    )
    got, want = engine.generate(prompts, params), hf.generate(prompts, params)
    assert want.finish_reason[0] == "stop" and want.finish_reason[1] == "stop"
    assert_same_batch(want, got)


def test_a_weight_change_is_synced_in_place(pair, prompts):
    model, hf, engine, _ = pair
    params = SamplingParams(max_new_tokens=24, greedy=True, temperature=0)
    old = engine.generate(prompts, params)
    perturb(model, 0.2, seed=1)
    engine.sync(model, (engine.version or 0) + 1)
    new_hf = hf.generate(prompts, params)
    assert (
        not torch.equal(old.completion_ids, new_hf.completion_ids)
        or (old.sampler_logp - new_hf.sampler_logp).abs().max() > 0.1
    )  # the change is visible, so equality below proves the sync
    assert_same_batch(new_hf, engine.generate(prompts, params))


def test_a_sync_with_a_new_version_pushes_an_optimizer_steps_weights(pair, prompts):
    model, hf, engine, _ = pair
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    params = SamplingParams(max_new_tokens=16, greedy=True, temperature=0)
    version = (engine.version or 0) + 1
    engine.sync(model, version)
    engine.generate(prompts, params)
    engine.sync(model, version)  # the same version again: nothing to push
    assert not engine.stale
    batch = hf.generate(prompts, SamplingParams(max_new_tokens=16, temperature=1.0), n=2)
    logp = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1])
    (-(logp * batch.completion_mask).sum()).backward()
    optimizer.step()
    optimizer.zero_grad()
    assert not engine.stale  # no optimizer hook: the trainer's sync decides
    engine.sync(model, version + 1)
    assert engine.stale
    assert_same_batch(hf.generate(prompts, params), engine.generate(prompts, params))


def test_twenty_syncs_stay_exact_without_growing_memory(pair, prompts):
    model, hf, engine, _ = pair
    params = SamplingParams(max_new_tokens=8, greedy=True, temperature=0)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for i in range(3):  # warm the allocator
        perturb(model, 0.01, seed=100 + i)
        engine.sync_weights()
    start = rss_bytes()
    for i in range(20):
        perturb(model, 0.01, seed=200 + i)
        engine.sync_weights()
    grown = rss_bytes() - start
    assert grown < 3 * param_bytes, (
        f"RSS grew {grown / 2**20:.1f} MiB over 20 syncs ({param_bytes / 2**20:.1f} MiB of weights)"
    )
    assert_same_batch(hf.generate(prompts, params), engine.generate(prompts, params))
