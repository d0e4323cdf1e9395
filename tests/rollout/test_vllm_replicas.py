"""Two `lmrl vllm-serve` replicas on vLLM's CPU build (`make test-vllm`) behind one `VLLMEngine`
(`lmrl.rollout.engines.vllm.replicas`): the same seed gives the rows one server gives, and a weight change reaches both
replicas (each samples half of the prompts, checked against what the HF model computes now). Without vLLM:
tests/rollout/test_replicas.py."""

import pytest
import torch
from vllm_helpers import require_vllm, tiny

require_vllm()

from lmrl.rollout import HFEngine, SamplingParams  # noqa: E402
from lmrl.rollout.engines.vllm.client import spawn  # noqa: E402
from lmrl.rollout.engines.vllm.driver import VLLMOptions  # noqa: E402
from lmrl.rollout.engines.vllm.engine import VLLMEngine  # noqa: E402
from lmrl.rollout.engines.vllm.replicas import Replicas, start_all  # noqa: E402

pytestmark = pytest.mark.vllm
OPTIONS = VLLMOptions(max_model_len=128, kv_cache_gb=0.0625, seed=0)
TEXTS = ["12+34=", "hello world", "The cat sat on", "7*8=", "99-1=", "abc"]


@pytest.fixture(scope="module")
def servers():
    """Two `lmrl vllm-serve` child processes (host:port each)."""
    spawned = [spawn(timeout=60) for _ in range(2)]
    yield [remote.url.removeprefix("http://") for remote in spawned]
    for remote in spawned:
        remote.close()


def test_two_replicas_sample_the_rows_of_one_server_and_both_get_every_push(servers, tok):
    model = tiny("qwen2", len(tok))
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    remotes = start_all(servers, 60, model, OPTIONS)
    replicas, one = (
        VLLMEngine(model, tok, OPTIONS, driver=Replicas(remotes)),
        VLLMEngine(model, tok, OPTIONS, driver=remotes[0]),
    )
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    for version in (0, 1):
        if version:  # a weight change: the next generate pushes it to every replica
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            replicas.sync(model, 1)
            one.sync(model, 1)
        got = replicas.generate(prompts, params, n=3, generator=torch.Generator().manual_seed(5))
        want = one.generate(prompts, params, n=3, generator=torch.Generator().manual_seed(5))
        assert torch.equal(got.completion_ids, want.completion_ids) and got.completions == want.completions
        assert (got.sampler_logp - want.sampler_logp).abs().max().item() < 1e-5
        greedy = SamplingParams(max_new_tokens=12, greedy=True, temperature=0)
        hf, both = HFEngine(model, tok).generate(prompts, greedy), replicas.generate(prompts, greedy)
        # prompts 0-2 are sampled by the first replica, 3-5 by the second: both have the HF model's weights now
        assert torch.equal(hf.completion_ids, both.completion_ids), version
        assert (hf.sampler_logp - both.sampler_logp).abs().max().item() < 1e-4
    replicas.close()


def test_gloo_pushes_give_both_replicas_the_trainers_weights(servers, tok):
    """vllm_weight_transport=gloo: the tensors reach both replicas through one broadcast on a process group; after a
    weight change each replica's half of the prompts is the HF model's greedy output (its log-probs within 1e-4)."""
    model = tiny("qwen2", len(tok), seed=1)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    driver = Replicas(start_all(servers, 60, model, OPTIONS))
    driver.use_transport("gloo", "cpu")
    assert driver.group is not None
    engine = VLLMEngine(model, tok, OPTIONS, driver=driver)
    greedy = SamplingParams(max_new_tokens=12, greedy=True, temperature=0)
    for version in (0, 1, 2):
        if version:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            engine.sync(model, version)
        hf, both = HFEngine(model, tok).generate(prompts, greedy), engine.generate(prompts, greedy)
        assert torch.equal(hf.completion_ids, both.completion_ids), version
        assert (hf.sampler_logp - both.sampler_logp).abs().max().item() < 1e-4, version
    assert engine.syncs == 3
    engine.close()
