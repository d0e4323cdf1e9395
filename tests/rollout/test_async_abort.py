"""`async_abort_on_push` (`lmrl.rollout.samplers.server_ahead.ServerAhead`): with the server's sampling held by gates, so that
which request has started at each push is fixed, a push cancels the queued requests that have not started and they
are sent again behind it: each batch carries the version it was sampled with (the fake records the weights the
"server" held while sampling), staleness drops from 2 to 1 with async_steps=2. No vLLM (`make test`)."""

import threading
from types import SimpleNamespace

import pytest

from lmrl.config import load_config
from lmrl.config_base import ConfigError
from lmrl.rollout.samplers import server_ahead as vllm_async
from lmrl.rollout.samplers.server_ahead import ServerAhead
from lmrl.trainers.rl.config import RLConfig

STEPS = 4


class FakeServerEngine:
    """Holds the last pushed weights (a version number); `sample_groups` below samples "with" them."""

    stale, tokenizer = False, None

    def __init__(self):
        self.loaded = None

    def snapshot(self, model):
        return model.version

    def push_snapshot(self, parts):
        self.loaded = parts

    def metrics(self):
        return {}

    def close(self):
        pass


def run(abort: bool, monkeypatch) -> list[dict]:
    """4 steps of async_steps=2; before each push the request of the step after next has started (it holds the
    server until its gate opens), the later ones are queued behind it."""
    started = {s: threading.Event() for s in range(1, STEPS + 1)}
    gates = {s: threading.Event() for s in range(1, STEPS + 1)}

    def sample_groups(engine, tokenizer, rows, options, step):
        started[step].set()
        assert gates[step].wait(30)
        return SimpleNamespace(step=step, sampled_with=engine.loaded)

    monkeypatch.setattr(vllm_async, "sample_groups", sample_groups)
    engine = FakeServerEngine()
    ahead = ServerAhead(engine, None, None, lambda step: [step], 2, STEPS, abort_on_push=abort)
    out = []
    for step in range(1, STEPS + 1):
        if step > 1:
            assert started[step].wait(30)  # this step's request is on the server: it finishes on the old weights
        ahead.sync(SimpleNamespace(version=step - 1), step - 1)
        gates[step].set()
        batch = ahead.sample([step], step)
        metrics = ahead.metrics()
        assert batch.step == step and batch.sampled_with == metrics["rollout/policy_version"]  # the true version
        out.append(metrics)
    ahead.close()
    return out


def test_a_push_resends_the_requests_that_had_not_started_so_they_sample_the_new_weights(monkeypatch):
    plain = run(False, monkeypatch)
    assert [m["rollout/policy_version"] for m in plain] == [0, 0, 0, 1]
    assert [m["rollout/staleness"] for m in plain] == [0, 1, 2, 2]
    aborting = run(True, monkeypatch)
    assert [m["rollout/policy_version"] for m in aborting] == [0, 0, 1, 2]
    assert [m["rollout/staleness"] for m in aborting] == [0, 1, 1, 1]
    assert [m["rollout/resent_requests"] for m in aborting] == [0, 1, 1, 0]


def test_async_abort_on_push_without_async_steps_on_servers_is_a_start_up_error():
    with pytest.raises(ConfigError, match=r"async_abort_on_push .*\(got async_steps=0.*Fix"):
        load_config(RLConfig, None, ["engine=vllm", "vllm_server=a:1", "async_abort_on_push=true"])
    config = load_config(
        RLConfig, None, ["engine=vllm", "vllm_server=a:1", "async_steps=2", "async_abort_on_push=true"]
    )
    assert config.async_abort_on_push
