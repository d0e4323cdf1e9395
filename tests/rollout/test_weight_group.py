"""Weight pushes over a process group (`vllm_weight_transport=gloo`, `lmrl.rollout.engines.vllm.group`) with fake engines
behind real `lmrl vllm-serve` HTTP handlers (no vLLM: `make test`): the packing round trip, every push (and an
async snapshot) loaded by every replica as over HTTP, a replica that does not join named with the fix, a refused
push answered at once, and the config errors. With vLLM: tests/rollout/test_vllm_weight_group.py."""

import pytest
import torch
from test_replicas import replicas, start  # noqa: F401 - the fixture: three fake replicas on local sockets
from test_vllm_sessions import weights

from lmrl.config import load_config
from lmrl.config_base import ConfigError
from lmrl.rollout.engines.vllm import client as vllm_client
from lmrl.rollout.engines.vllm import group as vllm_group
from lmrl.rollout.engines.vllm.client import RemoteVLLM, VLLMServerError
from lmrl.rollout.engines.vllm.group import layout, pack, resolve_transport, unpack
from lmrl.trainers.rl.config import RLConfig


def test_a_part_packs_into_one_aligned_buffer_and_back_unchanged():
    part = [
        ("a", torch.randn(3, 5)),
        ("b", torch.randn(7).to(torch.bfloat16)),
        ("c", torch.arange(6, dtype=torch.int64).view(2, 3)),
        ("d", torch.randn(4, 4).t()),  # not contiguous
    ]
    entries, total = layout(part)
    assert [e[3] % vllm_group.ALIGN for e in entries] == [0] * 4 and total == 64 + 16 + 48 + 64
    out = unpack(pack(part, total, "cpu"), entries)
    for name, tensor in part:
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor), name


def test_gloo_pushes_reach_every_replica_as_http_pushes_do(replicas, monkeypatch):  # noqa: F811
    monkeypatch.setattr(vllm_client, "PUSH_PART_BYTES", 32)  # 2 parts per push
    driver = start([address for _, address, _ in replicas])
    driver.use_transport("gloo", "cpu")
    assert driver.group is not None and [server.group["rank"] for server, _, _ in replicas] == [1, 2, 3]
    driver.load_weights(weights(1.0), tied=False)
    driver.push_encoded(driver.encode_weights(weights(3.0)), tied=False)  # async_steps' snapshot
    for server, _, _ in replicas:
        assert server.driver.loads == [{f"w{i}": 1.0 + i for i in range(4)}, {f"w{i}": 3.0 + i for i in range(4)}]
    one = RemoteVLLM(driver.remotes[0].url, 30, session=driver.remotes[0].session)
    with pytest.raises(VLLMServerError, match="part 2 of 2 arrived out of turn"):  # refused at once, no hang
        one.request_json("/group_weights", {"push": "x", "part": 1, "parts": 2, "tied": 0, "entries": [], "nbytes": 0})
    driver.close()
    assert all(server.group is None and server.owner is None for server, _, _ in replicas)


def test_a_replica_that_does_not_join_is_a_start_up_error_naming_it_and_the_fix(replicas, monkeypatch):  # noqa: F811
    (_, a, _), (silent, b, _), _ = replicas
    monkeypatch.setattr(vllm_group, "JOIN_TIMEOUT_S", 2.0)
    monkeypatch.setattr(silent, "join_group", lambda request, session=None: {"joined": True})  # never joins
    driver = start([a, b])
    with pytest.raises(ConfigError, match=r"vllm_weight_transport=gloo: the weight group .* did not form within 2 s"):
        driver.use_transport("gloo", "cpu")
    with pytest.raises(ConfigError, match="Fix: vllm_weight_transport=http"):
        driver.use_transport("gloo", "cpu")
    driver.close()


def test_auto_is_nccl_only_with_cuda_on_both_sides_and_nccl_elsewhere_is_refused():
    assert resolve_transport("auto", "cuda", ["cuda", "cuda"], "a, b") == "nccl"
    assert resolve_transport("auto", "cuda", ["cuda", "cpu"], "a, b") == "http"
    assert resolve_transport("auto", "cpu", ["cuda"], "a") == "http"
    assert resolve_transport("gloo", "cuda", ["cuda"], "a") == "gloo"
    with pytest.raises(ConfigError, match="nccl needs CUDA on both sides.*Fix: vllm_weight_transport=gloo"):
        resolve_transport("nccl", "cpu", ["cpu"], "a")


def test_transport_and_started_replicas_config_errors_name_the_key_and_the_fix():
    def config(*args):
        return load_config(RLConfig, None, list(args))

    assert config("engine=vllm", "vllm_server=a:1", "vllm_weight_transport=gloo").vllm_weight_transport == "gloo"
    assert config("engine=vllm", "vllm_replicas=2").vllm_replicas == 2
    with pytest.raises(ConfigError, match="vllm_weight_transport=gloo sets how weights reach vLLM servers.*Fix"):
        config("engine=vllm", "vllm_weight_transport=gloo")
    with pytest.raises(ConfigError, match="vllm_replicas=2 starts the servers and vllm_servers=.* names them. Fix"):
        config("engine=vllm", "vllm_replicas=2", "vllm_servers=[a:1,b:2]")
    with pytest.raises(ConfigError, match="vllm_replicas=2 starts the servers and vllm_server='auto'"):
        config("engine=vllm", "vllm_replicas=2", "vllm_server=auto")
    with pytest.raises(ConfigError, match="'vllm_replicas' must be >= 1"):
        config("engine=vllm", "vllm_replicas=0")
    with pytest.raises(ConfigError, match="vllm_replicas samples with vLLM, but engine=hf"):
        config("vllm_replicas=2")
