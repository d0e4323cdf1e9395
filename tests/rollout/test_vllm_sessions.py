"""One `lmrl vllm-serve` samples for one trainer, and a weight push in parts is loaded whole or not at all: the
server's HTTP handler and `RemoteVLLM` over a real local socket, with a fake engine in place of vLLM (no vLLM
needed: `make test`). The same server with vLLM: tests/rollout/test_vllm_server.py."""

import threading
from http.server import ThreadingHTTPServer

import pytest
import torch

from lmrl.config_base import ConfigError
from lmrl.rollout.engines.vllm import client as vllm_client
from lmrl.rollout.engines.vllm.client import RemoteVLLM, VLLMServerError
from lmrl.rollout.engines.vllm.driver import VLLMOptions
from lmrl.rollout.engines.vllm.server import Server, handler

SPEC = ({"model_type": "llama"}, "LlamaForCausalLM", VLLMOptions(max_model_len=64))


class FakeDriver:
    """Records each in-place load (name -> value of a 1-element tensor) and samples nothing."""

    def __init__(self):
        self.loads: list[dict[str, float]] = []

    def load_weights(self, weights, tied):
        self.loads.append({name: float(t.flatten()[0]) for name, t in weights})

    def sample(self, prompt_ids, n, temperature, max_tokens, stop_token_ids, seeds):
        return [[1]] * (len(prompt_ids) * n), [[-0.5]] * (len(prompt_ids) * n), [True] * (len(prompt_ids) * n)


class FakeServer(Server):
    def start_engine(self, request: dict) -> bool:
        if request["architecture"] == "Unknown":
            raise ConfigError("engine=vllm: vLLM does not support the architecture Unknown")
        reused = self.driver is not None
        self.driver = self.driver or FakeDriver()
        return reused


@pytest.fixture
def served():
    """(FakeServer, its URL) served on a free local port for the test."""
    server = FakeServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler(server))
    server.address = f"127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://{server.address}"
    httpd.shutdown()
    httpd.server_close()


def weights(value: float, count: int = 4):
    return [(f"w{i}", torch.full((4,), value + i)) for i in range(count)]


def sample(remote: RemoteVLLM):
    return remote.sample([[1, 2]], 1, 1.0, 1, [], [0])


def test_a_second_trainer_is_refused_with_the_server_and_the_fix_until_the_first_releases_it(served):
    server, url = served
    first, second = RemoteVLLM(url, timeout=30), RemoteVLLM(url, timeout=30)
    assert first.start(*SPEC) is False and first.session
    with pytest.raises(
        ConfigError,
        match=rf"vLLM server at {server.address} samples for another trainer \(pid .*"
        r"Fix: give this run a server of its own \(lmrl vllm-serve port=",
    ):
        second.start(*SPEC)
    first.load_weights(weights(1.0), tied=False)
    assert sample(first)[0] == [[1]]
    second.session = "guessed"  # no request without the owner's token is served
    with pytest.raises(VLLMServerError, match="samples for another trainer"):
        sample(second)
    with pytest.raises(VLLMServerError, match="samples for another trainer"):
        second.load_weights(weights(9.0), tied=False)
    assert server.driver.loads == [{f"w{i}": 1.0 + i for i in range(4)}]  # the refused push loaded nothing
    assert first.start(*SPEC) is True  # the owner comes back (e.g. resume): same session, the engine reused
    first.close()  # the end of the first run frees the server
    second.session = None
    assert second.start(*SPEC) is True and second.session != "guessed"
    sample(second)


def test_a_trainer_whose_start_fails_holds_no_session(served):
    _, url = served
    with pytest.raises(ConfigError, match="does not support the architecture Unknown"):
        RemoteVLLM(url, timeout=30).start(SPEC[0], "Unknown", SPEC[2])
    RemoteVLLM(url, timeout=30).start(*SPEC)  # the corrected run is not refused


def test_a_trainer_silent_for_longer_than_its_lease_frees_the_server(served):
    server, url = served
    crashed, next_run = RemoteVLLM(url, timeout=30), RemoteVLLM(url, timeout=30)
    crashed.start(*SPEC)
    server.owner["last"] -= 31  # no request for longer than its lease (its vllm_server_timeout)
    assert vllm_client.connect(url, 30).request("/health")["owner"] is None
    next_run.start(*SPEC)  # a run that crashed does not hold the server forever
    with pytest.raises(VLLMServerError, match="samples for another trainer"):
        sample(crashed)


def test_parts_of_two_pushes_never_mix_and_nothing_is_sampled_mid_push(served, monkeypatch):
    server, url = served
    monkeypatch.setattr(vllm_client, "PUSH_PART_BYTES", 32)  # two 16-byte tensors a part: 4 tensors, 2 parts
    remote = RemoteVLLM(url, timeout=30)
    remote.start(*SPEC)
    remote.load_weights(weights(1.0), tied=False)  # a whole push in 2 parts: one load with every tensor
    assert server.driver.loads == [{f"w{i}": 1.0 + i for i in range(4)}]

    def part(push: str, i: int, values, parts: int = 2):
        from safetensors.torch import save

        return remote.request("/weights", save(dict(values)), query=f"?part={i}&parts={parts}&tied=0&push={push}")

    new, other = weights(5.0), weights(7.0)
    part("a", 0, new[:2])
    with pytest.raises(VLLMServerError, match="mix old and new weights"):
        sample(remote)  # between the parts of a push
    part("b", 0, other[:2])  # another push starts: push a is dropped, never completed with b's parts
    with pytest.raises(VLLMServerError, match=r"push 'a': part 2 of 2 arrived out of turn \(push 'b' had 1 of 2"):
        part("a", 1, new[2:])
    with pytest.raises(VLLMServerError, match="part 2 of 2 arrived out of turn .no push was in progress"):
        part("b", 1, other[2:])  # b was dropped with a: neither is loaded
    part("c", 0, new[:2], parts=3)
    with pytest.raises(VLLMServerError, match="out of turn"):
        part("c", 1, new[2:], parts=2)  # the same id, another part count
    assert len(server.driver.loads) == 1  # nothing mixed (or partial) was ever loaded
    remote.load_weights(new, tied=False)  # the trainer's next sync pushes again, whole
    assert server.driver.loads[-1] == {f"w{i}": 5.0 + i for i in range(4)}
    assert sample(remote)[0] == [[1]]
