"""`lmrl rl` on two `lmrl vllm-serve` replicas (vLLM's CPU build, `make test-vllm`): `vllm_servers=[a, b]` trains
exactly as `vllm_server=a` (same seed, same weights, same rows); a replica that dies mid-run stops the run with its
address, and resume=true on a restarted replica continues as the uninterrupted run; `async_steps=1` samples each
batch one update ahead (staleness 1), and its resume (the batch sampled ahead is in the checkpoint) equals the
uninterrupted async run; vllm_weight_transport=gloo (pushes over a process group) trains as HTTP pushes, on one
server, on two replicas and with async_steps; vllm_replicas=2 starts its servers and stops them."""

import os

import pytest

if os.environ.get("LMRL_REQUIRE_VLLM"):  # `make test-vllm`: a missing vLLM is a failure, not a skip
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")

from lmrl.config import load_config  # noqa: E402
from lmrl.rollout.engines.vllm.client import VLLMServerError, spawn, stop_process  # noqa: E402
from lmrl.tracking import read_jsonl  # noqa: E402
from lmrl.trainers.rl import trainer as online  # noqa: E402
from tests.helpers import RL_RUN, VLLM_TINY, register_once

pytestmark = pytest.mark.vllm
KILL: dict = {}  # {"after": reward calls, "process": a server process}: the reward kills it mid-run; {"crash": n}


class Crash(BaseException):
    """The trainer's process ends mid-step (as on Ctrl-C or a node failure)."""


def digit_fraction(prompts, completions, **kwargs):
    KILL["calls"] = KILL.get("calls", 0) + 1
    if KILL.get("after") == KILL["calls"]:
        stop_process(KILL["process"])
    if KILL.get("crash") == KILL["calls"]:
        raise Crash
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


register_once("test_servers_digit_fraction", digit_fraction)


@pytest.fixture(scope="module")
def servers():
    """Two `lmrl vllm-serve` child processes: [(host:port, RemoteVLLM holding the process)]."""
    spawned = [spawn(timeout=60) for _ in range(2)]
    yield spawned
    for remote in spawned:
        remote.close()


def address(remote) -> str:
    return remote.url.removeprefix("http://")


def grpo(run, *overrides):
    config = load_config(
        online.RLConfig,
        None,
        [
            "algorithm=grpo",
            "engine=vllm",
            f"output_dir={run}",
            "precision=fp32",
            *VLLM_TINY,
            *RL_RUN,
            "rewards=[test_servers_digit_fraction]",
            "eval_every=0",
            "log_every=1",
            "lr=1e-2",
            "sample_every=100",
            "vllm_kv_cache_gb=0.0625",
            "vllm_max_model_len=128",
            "vllm_server_timeout=30",
            *overrides,
        ],
    )
    online.train(config)
    return {r["step"]: r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r}


def assert_same_steps(got: dict, want: dict, steps) -> None:
    for step in steps:
        assert got[step]["completion_len/mean"] == want[step]["completion_len/mean"], step  # the same rows
        assert got[step]["reward/mean"] == want[step]["reward/mean"], step
        assert abs(got[step]["loss"] - want[step]["loss"]) < 1e-5, (step, got[step]["loss"], want[step]["loss"])


@pytest.fixture(scope="module")
def one(servers, tmp_path_factory):
    """4 GRPO steps on one server, weights over HTTP: what the other transports and replica counts must give."""
    return grpo(tmp_path_factory.mktemp("one"), f"vllm_server={address(servers[0])}", "max_steps=4", "save_every=0")


def test_gloo_pushes_on_one_and_two_replicas_train_as_http_pushes(tmp_path, servers, one, monkeypatch):
    from lmrl.rollout.engines.vllm import group as vllm_group

    parts, send = [], vllm_group.WeightGroup.send
    monkeypatch.setattr(
        vllm_group.WeightGroup, "send", lambda self, *a: parts.append(len(self.remotes)) or send(self, *a)
    )
    a, b = servers
    args = ["vllm_weight_transport=gloo", "max_steps=4", "save_every=0"]
    assert_same_steps(grpo(tmp_path / "gloo1", f"vllm_server={address(a)}", *args), one, range(1, 5))
    assert_same_steps(grpo(tmp_path / "gloo2", f"vllm_servers=[{address(a)},{address(b)}]", *args), one, range(1, 5))
    assert parts == [1] * 4 + [2] * 4  # every push of both runs went over the group (one part each)


def test_two_replicas_train_as_one_server_and_a_dead_replica_stops_the_run_resumably(tmp_path, servers, one):
    a, b = servers
    two = grpo(tmp_path / "two", f"vllm_servers=[{address(a)},{address(b)}]", "max_steps=4", "save_every=0")
    assert_same_steps(two, one, range(1, 5))
    assert len({r["reward/mean"] for r in one.values()}) > 1  # the steps differ: the comparison is not vacuous
    KILL.update(calls=0, after=3, process=b.process)  # replica b dies after step 3's rollout
    run = tmp_path / "killed"
    with pytest.raises(VLLMServerError, match=rf"vLLM server at {b.url} did not answer /weights.*resume=true"):
        grpo(run, f"vllm_servers=[{address(a)},{address(b)}]", "max_steps=4", "save_every=1")
    KILL.clear()
    assert (run / "checkpoints" / "step-3").is_dir()
    b2 = spawn(timeout=60)  # the replica restarted (on another port)
    servers[1] = b2
    resumed = grpo(run, f"vllm_servers=[{address(a)},{address(b2)}]", "max_steps=4", "save_every=1", "resume=true")
    assert_same_steps(resumed, two, range(1, 5))


def test_async_steps_on_two_replicas_samples_one_update_ahead_and_resumes_exactly(tmp_path, servers):
    replicas = f"vllm_servers=[{address(servers[0])},{address(servers[1])}]"
    args = [replicas, "async_steps=1", "max_steps=4"]
    sync = grpo(tmp_path / "sync", replicas, "max_steps=4", "save_every=0")
    full = grpo(tmp_path / "full", *args, "save_every=0")
    assert [full[s]["rollout/staleness"] for s in range(1, 5)] == [0, 1, 1, 1]  # step s: weights of update s-2
    assert [full[s]["rollout/policy_version"] for s in range(1, 5)] == [0, 0, 1, 2]
    assert_same_steps(full, sync, [1])  # the first batch: the initial weights in both
    assert full[2]["loss"] != sync[2]["loss"]  # then a batch one update old, corrected by the importance weight
    assert all(full[s]["policy/tis_weight_mean"] != 1.0 for s in (2, 3, 4) if "policy/tis_weight_mean" in full[s])
    gloo = grpo(tmp_path / "gloo", *args, "save_every=0", "vllm_weight_transport=gloo")  # snapshots over the group
    assert_same_steps(gloo, full, range(1, 5))
    aborting = grpo(
        tmp_path / "abort", replicas, "async_steps=2", "max_steps=4", "save_every=0", "async_abort_on_push=true"
    )
    assert all(aborting[s]["rollout/staleness"] in (0, 1, 2) for s in range(1, 5))  # depends on timing
    assert all(aborting[s]["rollout/resent_requests"] >= 0 for s in range(1, 5))
    run = tmp_path / "resumed"
    KILL.update(calls=0, crash=3)  # the run ends in step 3, after the step-2 checkpoint (which holds step 3's batch)
    with pytest.raises(Crash):
        grpo(run, *args, "save_every=2")
    KILL.clear()
    resumed = grpo(run, *args, "save_every=2", "resume=true")
    assert_same_steps(resumed, full, range(1, 5))


def test_vllm_replicas_starts_two_servers_for_the_run_and_stops_them(tmp_path, one, monkeypatch):
    """vllm_replicas=2: two `lmrl vllm-serve` children on free ports, trained on as the listed replicas are (the
    first 2 steps equal one server's), stopped when the run ends."""
    from lmrl.rollout.engines.vllm import client as vllm_client

    started, launch = [], vllm_client.launch
    monkeypatch.setattr(vllm_client, "launch", lambda timeout: started.append(launch(timeout)) or started[-1])
    two = grpo(tmp_path / "spawned", "vllm_replicas=2", "max_steps=2", "save_every=0")
    assert len(started) == 2 and all(remote.process.poll() is not None for remote in started)
    assert_same_steps(two, one, range(1, 3))
