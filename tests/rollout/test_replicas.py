"""Several vLLM server replicas (`vllm_servers`, `lmrl.rollout.engines.vllm.replicas`) over real local sockets, with a fake
engine in each `lmrl vllm-serve` handler (no vLLM needed: `make test`): prompts split in order and rows back in
prompt order, every push loaded by every replica, a second trainer refused on every replica (holding none), a
replica missing at start-up or dying mid-run named in the error. With vLLM: tests/rollout/test_vllm_replicas.py."""

import socket
import threading
from http.server import ThreadingHTTPServer

import pytest
import torch
from test_vllm_sessions import SPEC, FakeDriver, FakeServer, weights

from lmrl.config import load_config
from lmrl.config_base import ConfigError
from lmrl.rollout.engines.vllm import client as vllm_client
from lmrl.rollout.engines.vllm.client import RemoteVLLM, VLLMServerError
from lmrl.rollout.engines.vllm.replicas import Replicas, spans, start_all
from lmrl.trainers.rl.config import RLConfig


class EchoDriver(FakeDriver):
    """Samples row j of prompt p with seed s as [p[0], s + j] (what a per-request seed gives: the row depends on its
    prompt and seed only), and records the prompts of each request."""

    def __init__(self):
        super().__init__()
        self.requests: list[list[list[int]]] = []

    def sample(self, prompt_ids, n, temperature, max_tokens, stop_token_ids, seeds):
        self.requests.append(prompt_ids)
        rows = [[p[0], s + j] for p, s in zip(prompt_ids, seeds) for j in range(n)]
        return rows, [[-0.5, -0.25]] * len(rows), [True] * len(rows)


class EchoServer(FakeServer):
    def start_engine(self, request: dict) -> bool:
        reused = self.driver is not None
        self.driver = self.driver or EchoDriver()
        return reused


@pytest.fixture
def replicas():
    """Three (EchoServer, host:port, httpd) served on free local ports for the test."""
    served = []
    for _ in range(3):
        server = EchoServer()
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_of(server))
        server.address = f"127.0.0.1:{httpd.server_address[1]}"
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        served.append((server, server.address, httpd))
    yield served
    for _, _, httpd in served:
        httpd.shutdown()
        httpd.server_close()


def handler_of(server):
    from lmrl.rollout.engines.vllm.server import handler

    return handler(server)


def start(addresses: list[str]) -> Replicas:
    model = torch.nn.Linear(1, 1)
    model.config = type("Config", (), {"to_json_string": lambda self: '{"model_type": "llama"}'})()
    return Replicas(start_all(addresses, 30, model, SPEC[2]))


def test_spans_cut_the_prompts_in_order_into_nearly_equal_parts():
    assert spans(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert spans(4, 2) == [(0, 2), (2, 4)]
    assert spans(1, 3) == [(0, 1), (1, 1), (1, 1)]


def test_replicas_sample_spans_of_the_prompts_and_return_one_servers_rows(replicas):
    driver = start([address for _, address, _ in replicas])
    prompts, seeds = [[10], [11], [12], [13], [14]], [100, 200, 300, 400, 500]
    tokens, logps, stopped = driver.sample(prompts, 2, 1.0, 4, [], seeds)
    assert tokens == [[p[0], s + j] for p, s in zip(prompts, seeds) for j in range(2)]  # prompt-major, in order
    assert len(logps) == len(stopped) == 10
    assert [server.driver.requests for server, _, _ in replicas] == [[prompts[:2]], [prompts[2:4]], [prompts[4:]]]
    one = RemoteVLLM(f"http://{replicas[0][1]}", 30, session=driver.remotes[0].session)
    assert one.sample(prompts, 2, 1.0, 4, [], seeds)[0] == tokens  # the rows one server gives
    driver.sample([[7]], 1, 1.0, 4, [], [1])  # fewer prompts than replicas: the idle ones get no request
    assert [len(server.driver.requests) for server, _, _ in replicas] == [3, 1, 1]


def test_every_push_is_loaded_by_every_replica(replicas, monkeypatch):
    monkeypatch.setattr(vllm_client, "PUSH_PART_BYTES", 32)  # 2 parts per push
    driver = start([address for _, address, _ in replicas])
    driver.load_weights(weights(1.0), tied=False)
    driver.push_encoded(driver.encode_weights(weights(3.0)), tied=False)  # async_steps' snapshot push
    for server, _, _ in replicas:
        assert server.driver.loads == [{f"w{i}": 1.0 + i for i in range(4)}, {f"w{i}": 3.0 + i for i in range(4)}]


def test_a_second_trainer_is_refused_on_every_replica_and_holds_none(replicas):
    (first, a, _), (second, b, _), (third, c, _) = replicas
    owner = RemoteVLLM(f"http://{b}", 30)
    owner.start(*SPEC)  # another trainer holds replica b
    with pytest.raises(ConfigError, match=rf"vLLM server at {b} samples for another trainer"):
        start([a, b, c])
    assert first.owner is None and third.owner is None  # the refused trainer released a and c
    driver = start([a, c])  # free replicas can be taken
    with pytest.raises(ConfigError, match=rf"vLLM server at {a} samples for another trainer"):
        start([a])
    driver.close()
    owner.close()
    assert all(server.owner is None for server, _, _ in replicas)  # every session ended with its trainer


def test_a_replica_missing_at_start_up_or_dying_mid_run_is_named(replicas):
    (_, a, _), (_, b, httpd_b), (_, c, _) = replicas
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = f"127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(ConfigError, match=rf"no vLLM server answers at http://{free}.*lmrl vllm-serve port="):
        start([a, free])
    driver = start([a, b, c])
    httpd_b.shutdown()
    httpd_b.server_close()
    with pytest.raises(VLLMServerError, match=rf"vLLM server at http://{b} did not answer /sample.*resume=true"):
        driver.sample([[1], [2], [3]], 1, 1.0, 4, [], [1, 2, 3])
    with pytest.raises(VLLMServerError, match=rf"http://{b} did not answer /weights"):
        driver.load_weights(weights(2.0), tied=False)


def test_vllm_servers_config_errors_name_the_key_and_the_fix():
    def config(*args):
        return load_config(RLConfig, None, ["engine=vllm", *args])

    assert config("vllm_servers=[127.0.0.1:8001,127.0.0.1:8002]").vllm_servers == ["127.0.0.1:8001", "127.0.0.1:8002"]
    with pytest.raises(ConfigError, match="vllm_server='127.0.0.1:8001' and vllm_servers=.* both name.*Fix: one"):
        config("vllm_server=127.0.0.1:8001", "vllm_servers=[127.0.0.1:8002]")
    with pytest.raises(ConfigError, match="names a server twice"):
        config("vllm_servers=[127.0.0.1:8001,127.0.0.1:8001]")
    with pytest.raises(ConfigError, match="vllm_servers='8001': give host:port"):
        config("vllm_servers=[8001]")
    with pytest.raises(ConfigError, match="vllm_servers samples with vLLM, but engine=hf"):
        load_config(RLConfig, None, ["vllm_servers=[127.0.0.1:8001]"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["async_steps=1"], "placement=ray.*vLLM servers.*engine=hf samples in the learner's process"),
        (["async_steps=1", "engine=vllm"], "engine=vllm without a server samples in the learner's process"),
        (["async_steps=1", "engine=vllm", "vllm_servers=[a:1,b:2]", "ppo_epochs=2"], "one update per step"),
        (["async_steps=1", "engine=vllm", "vllm_server=a:1", "algorithm=ppo"], "no value model"),
        (["async_steps=1", "engine=vllm", "vllm_server=a:1", "dynamic_sampling=refill"], "refill.*async_steps=0"),
        (["async_steps=1", "engine=vllm", "vllm_server=a:1", "curriculum=[0.1,0.9]"], "no curriculum"),
        (["async_steps=-1", "engine=vllm", "vllm_server=a:1"], "'async_steps' must be >= 0"),
    ],
)
def test_async_steps_without_a_sampler_that_can_run_ahead_is_a_start_up_error(args, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RLConfig, None, args)


def test_started_replicas_that_fail_are_named_and_none_is_left_running(replicas, monkeypatch):
    """vllm_replicas=N (`vllm_client.spawn_all`) with stand-in children: replica 1 answers (a fake server), replica 2
    exits at once; and a Ctrl-C while waiting. Every child is stopped either way."""
    import subprocess
    import sys

    children = []

    def launch(timeout):
        answering = len(children) == 0
        code = "import time; time.sleep(60)" if answering else "raise SystemExit(3)"
        children.append(subprocess.Popen([sys.executable, "-c", code]))
        url = f"http://{replicas[0][1]}" if answering else "http://127.0.0.1:9"
        return RemoteVLLM(url, timeout, children[-1])

    monkeypatch.setattr(vllm_client, "launch", launch)
    with pytest.raises(ConfigError, match=r"vllm_replicas=2: replica 2: the vLLM server .* did not start \(status 3"):
        vllm_client.spawn_all(2, 30)
    assert all(child.poll() is not None for child in children)
    children.clear()

    def interrupted(remote, label):
        raise KeyboardInterrupt  # Ctrl-C while waiting for a replica

    monkeypatch.setattr(vllm_client, "wait_healthy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        vllm_client.spawn_all(2, 30)
    assert len(children) == 2 and all(child.poll() is not None for child in children)
