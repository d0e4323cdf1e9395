"""Server mode on vLLM's CPU build (`make test-vllm`): `lmrl vllm-serve` in a child process (what vllm_server=auto
starts), driven over HTTP by `VLLMEngine` with a `RemoteVLLM`. Checked against what the HF model computes now (so a
weight change proves the push) and against a colocated engine on the same model (same seeds -> same batch); killing
the server stops the next request with a clear error instead of hanging it.
"""

import os
import socket

import pytest
import torch
from vllm_helpers import assert_samples_the_model, require_vllm, tiny, train_on_samples

require_vllm()

from lmrl.config_base import ConfigError  # noqa: E402
from lmrl.rollout import (  # noqa: E402
    HFEngine,
    SamplingParams,
)
from lmrl.rollout.engines.vllm import client as vllm_client  # noqa: E402
from lmrl.rollout.engines.vllm.client import VLLMServerError, spawn  # noqa: E402
from lmrl.rollout.engines.vllm.driver import VLLMOptions  # noqa: E402
from lmrl.rollout.engines.vllm.engine import VLLMEngine, model_spec  # noqa: E402

pytestmark = pytest.mark.vllm
GREEDY = SamplingParams(max_new_tokens=20, greedy=True, temperature=0)
OPTIONS = VLLMOptions(max_model_len=128, kv_cache_gb=0.0625, seed=0)


@pytest.fixture(scope="module")
def served(tok):
    """(tied Qwen2, a VLLMEngine whose vLLM is a `lmrl vllm-serve` child process, that RemoteVLLM)."""
    model = tiny("qwen2", len(tok))
    remote = spawn(timeout=60)
    assert remote.start(*model_spec(model), OPTIONS) is False
    assert remote.start(*model_spec(model), OPTIONS) is True  # the same model again: the running engine is reused
    yield model, VLLMEngine(model, tok, OPTIONS, driver=remote), remote
    remote.close()


def assert_matches_hf(model, engine, prompts, tok):
    want, got, _ = assert_samples_the_model(model, engine, prompts, tok, GREEDY, temperature=0.7, n=4, seed=2)
    assert want.finish_reason == got.finish_reason


def test_the_server_samples_the_models_greedy_output_and_log_probs(served, prompts, tok):
    model, engine, _ = served
    assert_matches_hf(model, engine, prompts, tok)


def test_a_weight_change_is_pushed_to_the_server(served, prompts, tok, monkeypatch):
    monkeypatch.setattr(vllm_client, "PUSH_PART_BYTES", 2**17)  # ~1.3 MB of weights: a push in several parts
    model, engine, remote = served
    paths, request = [], remote.request
    monkeypatch.setattr(remote, "request", lambda path, *a, **k: (paths.append(path), request(path, *a, **k))[1])
    old = engine.generate(prompts, GREEDY)
    syncs = engine.syncs
    train_on_samples(model, engine, prompts, torch.optim.SGD(model.parameters(), lr=0.5), seed=0)
    assert engine.stale
    new = HFEngine(model, tok).generate(prompts, GREEDY)
    assert (
        not torch.equal(old.completion_ids, new.completion_ids)
        or (old.sampler_logp - new.sampler_logp).abs().max() > 0.1
    )  # the step is visible, so the match proves the push
    assert_matches_hf(model, engine, prompts, tok)
    assert engine.syncs == syncs + 1 and paths.count("/weights") > 1  # one push, in several parts


def test_server_and_colocated_engines_give_the_same_batch_for_the_same_seed(served, prompts, tok):
    model, engine, _ = served
    colocated = VLLMEngine(model, tok, OPTIONS)
    params = SamplingParams(max_new_tokens=12, temperature=0.9, stop_token_ids=(tok.eos_token_id,))
    remote = engine.generate(prompts, params, n=3, generator=torch.Generator().manual_seed(7))
    local = colocated.generate(prompts, params, n=3, generator=torch.Generator().manual_seed(7))
    for name in ("prompt_ids", "completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(remote, name), getattr(local, name)), name
    assert remote.completions == local.completions and remote.finish_reason == local.finish_reason
    assert (remote.sampler_logp - local.sampler_logp).abs().max().item() < 1e-6


def test_a_trainer_with_another_model_replaces_the_servers_engine(served, prompts, tok):
    _, _, remote = served
    other = tiny("llama", len(tok), seed=1)
    assert remote.start(*model_spec(other), OPTIONS) is False  # a new engine, on the Llama
    assert_matches_hf(other, VLLMEngine(other, tok, OPTIONS, driver=remote), prompts, tok)


def test_a_second_trainer_is_refused_while_the_first_owns_the_server(served):
    model, _, remote = served
    other = vllm_client.RemoteVLLM(remote.url, timeout=60)
    with pytest.raises(
        ConfigError,
        match=rf"vLLM server at {remote.url.removeprefix('http://')} samples for another "
        r"trainer.*Fix: give this run a server of its own",
    ):
        other.start(*model_spec(model), OPTIONS)
    assert remote.request("/health")["owner"] == f"pid {os.getpid()} on {socket.gethostname()}"  # still this one


def test_a_killed_server_stops_the_next_request_with_a_clear_error(served, prompts):
    _, engine, remote = served
    remote.process.kill()
    remote.process.wait()
    engine.sync(engine.model, (engine.version or 0) + 1)  # new weights: the next generate pushes them
    with pytest.raises(VLLMServerError, match="did not answer /weights.*exited.*lmrl vllm-serve"):
        engine.generate(prompts, GREEDY)  # the connection is refused: no wait for the request timeout
