"""`EngineSection`: the config keys that pick and set up the rollout engine (`lmrl.rollout.engines.factory.make_engine`).

Composed into every sampling trainer's config (`RLConfig(SamplingSection, EngineSection, ...)`), like the shared
sections of `lmrl.config`; kept here, beside the engines, so that `lmrl.config` stays one screenful of sections.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config_base import ConfigError, Section, check_at_least, field, section_view


@dataclasses.dataclass
class EngineSection(Section):
    """Which rollout engine samples (`lmrl.rollout.engines.factory.make_engine`); the vllm_* keys apply to engine=vllm."""

    title = "rollout engine"
    engine: Literal["hf", "vllm"] = field(
        "hf",
        "hf: KV-cache sampling from the training model; vllm: vLLM in this "
        "process, weights synced in place after every optimizer step",
    )
    vllm_gpu_memory_utilization: float = field(0.3, "GPU: share of GPU memory vLLM may take (weights + KV cache)")
    vllm_max_model_len: int | None = field(
        None, "longest prompt + completion in tokens (null: the model's max_position_embeddings, at most 4096)"
    )
    vllm_sleep: bool = field(False, "GPU: free vLLM's memory between rollouts (sleep/wake), so training gets it")
    vllm_kv_cache_gb: float = field(1.0, "CPU: KV-cache budget in GiB (vLLM's automatic one reserves most RAM)")
    vllm_server: str | None = field(
        None,
        "null: vLLM in this process; host:port: a `lmrl vllm-serve` process "
        "(weights pushed to it after every step); auto: lmrl starts one",
    )
    vllm_servers: list[str] | None = field(
        None,
        "several `lmrl vllm-serve` replicas [host:port, ...]: each step's "
        "prompts split across them in order, weights pushed to all after "
        "every step (null: vllm_server; docs/vllm.md)",
    )
    vllm_replicas: int | None = field(
        None,
        "start this many `lmrl vllm-serve` replicas as child processes on free local ports (as vllm_server=auto "
        "does for one), stopped with the run; null: vllm_server / vllm_servers",
    )
    vllm_weight_transport: Literal["http", "gloo", "nccl", "auto"] = field(
        "http",
        "server mode: how pushes reach the servers; http: safetensors bodies over the HTTP API; gloo / nccl: "
        "announced over HTTP, tensors broadcast over a process group with the servers (nccl: CUDA on both sides; "
        "untested here); auto: nccl when the trainer and every server are on CUDA, else http",
    )
    vllm_lora_sync: Literal["merged", "adapter"] = field(
        "merged",
        "LoRA runs: push the merged weights W + BA after "
        "each step (merged), or only the adapters (adapter: "
        "vLLM serves them; base weights pushed once; "
        "colocated, one process)",
    )
    vllm_server_timeout: float = field(
        600.0, "server mode: seconds to wait for any one request (a dead server stops the run instead of hanging it)"
    )

    def __post_init__(self) -> None:
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ConfigError(
                f"'vllm_gpu_memory_utilization' must be in (0, 1], got {self.vllm_gpu_memory_utilization}."
            )
        if self.vllm_max_model_len is not None:
            check_at_least(self, ("vllm_max_model_len",), 1)
        check_at_least(self, ("vllm_kv_cache_gb", "vllm_server_timeout"), 0, inclusive=False)
        from lmrl.rollout.engines.vllm.wire import parse_server  # torch-free: configs check without torch (lmrl.cli)

        if self.vllm_server not in (None, "auto"):
            parse_server(self.vllm_server)
        if self.vllm_servers is not None:
            self.check_replicas(parse_server)
        if self.vllm_replicas is not None:
            check_at_least(self, ("vllm_replicas",), 1)
        super().__post_init__()  # then the rules between these keys and the others (`lmrl.config_rules`)

    def check_replicas(self, parse_server) -> None:
        if not self.vllm_servers:
            raise ConfigError(
                "vllm_servers=[] names no server. Fix: vllm_servers=[host:port, ...] of running `lmrl "
                "vllm-serve` processes, or vllm_servers=null."
            )
        urls = [parse_server(s, "vllm_servers") if s != "auto" else s for s in self.vllm_servers]
        if "auto" in urls:
            raise ConfigError(
                "vllm_servers takes host:port of running `lmrl vllm-serve` processes; auto starts one "
                "server (vllm_server=auto). Fix: start the replicas (lmrl vllm-serve port=...) and list "
                "them, or vllm_server=auto."
            )
        if len(set(urls)) < len(urls):
            raise ConfigError(
                f"vllm_servers={self.vllm_servers} names a server twice (one trainer session per "
                "server). Fix: each replica once."
            )

    @property
    def servers(self) -> list[str]:
        """The vLLM servers this config samples on: vllm_servers, or [vllm_server], or ["auto"] * vllm_replicas
        (started for the run), or [] (vLLM in this process, or engine=hf)."""
        if self.vllm_replicas:
            return ["auto"] * self.vllm_replicas
        if self.vllm_servers:
            return list(self.vllm_servers)
        return [self.vllm_server] if self.vllm_server else []

    @property
    def engine_setup(self) -> EngineSection:
        return section_view(self, EngineSection)


def server_list(config: EngineSection) -> list[str]:
    """`EngineSection.servers` of ``config`` (`lmrl.rollout.engines.factory`)."""
    return config.servers
