"""The engine factory and engine=vllm's start-up checks, which need no vLLM; and the vLLM engine's stop-string replay
and LoRA weight naming, checked against the HF engine and peft names."""

import importlib.util

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from lmrl.config import ConfigError, load_config
from lmrl.generate import GenerateConfig
from lmrl.rollout import HFEngine, SamplingParams
from lmrl.rollout.engines import factory as engines
from lmrl.rollout.engines.section import EngineSection
from lmrl.rollout.engines.stop_strings import apply_stop_strings
from lmrl.rollout.engines.vllm.engine import check_exact_logprobs
from lmrl.rollout.engines.vllm.weights import checkpoint_name, hf_weights
from lmrl.swarm.config import SwarmConfig
from lmrl.trainers.dpo.config import DPOConfig
from lmrl.trainers.rejection.trainer import RejectionConfig
from lmrl.trainers.rl.config import RLConfig
from lmrl.trainers.selfplay.config import SelfPlayConfig
from tests.helpers import tiny_llama

HEADS = (32, 64, 128)


def char_tokenizer():
    from lmrl.data.tokenizers import build_char_tokenizer

    return build_char_tokenizer()


def llama32(vocab: int):
    """A tiny Llama with 2 heads of 32 (vLLM's CPU attention runs head size 32)."""
    return tiny_llama(vocab, num_attention_heads=2, num_key_value_heads=2)


@pytest.mark.parametrize("cls", [RLConfig, DPOConfig, RejectionConfig, SelfPlayConfig, SwarmConfig, GenerateConfig])
def test_every_sampling_trainer_has_the_engine_keys(cls):
    extra = ["verifier=arithmetic", "rewards=[task]"] if cls is SelfPlayConfig else []
    config = load_config(cls, None, ["engine=vllm", "vllm_max_model_len=512", *extra])
    assert isinstance(config, EngineSection) and config.engine == "vllm" and config.vllm_max_model_len == 512
    with pytest.raises(ConfigError, match="engine"):
        load_config(cls, None, ["engine=sglang"])


def test_engine_hf_is_the_hf_engine():
    tok = char_tokenizer()
    config = load_config(RLConfig, None, [])
    engine = engines.make_engine(config, llama32(len(tok)), tok, None, sampling=SamplingParams())
    assert isinstance(engine, HFEngine)


def test_engine_vllm_without_vllm_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    tok = char_tokenizer()
    config = load_config(RLConfig, None, ["engine=vllm"])
    with pytest.raises(ConfigError, match=r"pip install 'lmrl\[vllm\]'.*engine=hf"):
        engines.make_engine(config, llama32(len(tok)), tok, None, sampling=SamplingParams())


def test_an_unsupported_architecture_suggests_engine_hf():
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, architectures=["MyNewForCausalLM"])
    with pytest.raises(ConfigError, match="does not support the architecture MyNewForCausalLM.*engine=hf"):
        engines.check_architecture(cfg, {"LlamaForCausalLM"}, "cpu", HEADS)


def test_a_head_size_the_cpu_backend_lacks_suggests_engine_hf():
    cfg = Qwen2Config(hidden_size=384, num_attention_heads=8, architectures=["Qwen2ForCausalLM"])  # head size 48
    with pytest.raises(ConfigError, match="head sizes.*48.*engine=hf"):
        engines.check_architecture(cfg, {"Qwen2ForCausalLM"}, "cpu", HEADS)
    engines.check_architecture(cfg, {"Qwen2ForCausalLM"}, "cuda", HEADS)  # GPU kernels take other sizes
    engines.check_architecture(
        Qwen2Config(hidden_size=384, num_attention_heads=6, architectures=["Qwen2ForCausalLM"]),
        {"Qwen2ForCausalLM"},
        "cpu",
        HEADS,
    )


def test_a_too_short_max_model_len_fails_with_the_length_needed():
    with pytest.raises(ConfigError, match="vllm_max_model_len=64 is shorter.*40 tokens.*max_new_tokens=32.*>=72"):
        engines.check_max_model_len(64, 1024, 40, 32)
    with pytest.raises(ConfigError, match="exceeds the model's max_position_embeddings=1024"):
        engines.check_max_model_len(2048, 1024, 1, 32)
    engines.check_max_model_len(72, 1024, 40, 32)


def test_bad_engine_options_fail_at_start_up():
    with pytest.raises(ConfigError, match="vllm_gpu_memory_utilization"):
        load_config(RLConfig, None, ["vllm_gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match="vllm_max_model_len"):
        load_config(RLConfig, None, ["vllm_max_model_len=0"])


def test_only_sampling_whose_log_probs_vllm_returns_exactly_is_accepted():
    check_exact_logprobs(SamplingParams(temperature=0.7))
    check_exact_logprobs(SamplingParams(greedy=True, temperature=0))
    for bad in (SamplingParams(top_k=5), SamplingParams(top_p=0.9), SamplingParams(greedy=True, temperature=0.5)):
        with pytest.raises(ValueError, match="engine=hf"):
            check_exact_logprobs(bad)


def test_stop_strings_replayed_after_generation_equal_the_hf_engines():
    tok = char_tokenizer()
    model = llama32(len(tok))
    engine = HFEngine(model, tok)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["hello world", "2+2=", "abc", "The cat"]]
    free = engine.generate(prompts, SamplingParams(max_new_tokens=20, greedy=True, temperature=0, stop_token_ids=()))
    stops = (free.completions[0][4:6], free.completions[2][9:10])
    want = engine.generate(
        prompts, SamplingParams(max_new_tokens=20, greedy=True, temperature=0, stop_token_ids=(), stop_strings=stops)
    )
    assert "stop" in want.finish_reason
    lengths, stopped = apply_stop_strings(
        engine._matcher(stops), free.completion_ids, free.completion_lengths, ~free.truncated
    )
    assert lengths.tolist() == want.completion_lengths.tolist()
    assert stopped.tolist() == (~want.truncated).tolist()


def test_lora_weights_are_pushed_under_the_base_models_names():
    assert checkpoint_name("model.layers.0.mlp.up_proj.weight", peft=False) == "model.layers.0.mlp.up_proj.weight"
    names = {
        "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight": "model.layers.0.self_attn.q_proj.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": None,
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight": None,
        "base_model.model.lm_head.modules_to_save.default.weight": "lm_head.weight",
        "base_model.model.lm_head.original_module.weight": None,
        "base_model.model.model.norm.weight": "model.norm.weight",
    }
    for name, want in names.items():
        assert checkpoint_name(name, peft=True) == want, name


def test_merged_lora_weights_equal_the_merged_model():
    peft = pytest.importorskip("peft")
    tok = char_tokenizer()
    model = peft.get_peft_model(
        llama32(len(tok)), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    from lmrl.rollout.engines.vllm.weights import merged_adapters

    with torch.no_grad(), merged_adapters(model):
        pushed = {name: t.clone() for name, t in hf_weights(model)}
    assert not any("lora" in n for n in pushed)
    merged = model.merge_and_unload()  # the reference: W + BA written into a plain model
    assert set(pushed) == {n for n, _ in merged.named_parameters()}
    for name, param in merged.named_parameters():
        assert torch.allclose(pushed[name], param, atol=1e-6), name


def test_the_architecture_is_the_hf_class_under_torch_distributed_wrappers():
    # FSDP2's fully_shard and the composable replicate (DDP) swap the module's class for FSDP<cls> / DDP<cls>: with
    # nproc>1 vLLM was asked for "DDPLlamaForCausalLM" and refused the run at start-up
    from torch.distributed._composable.replicate import DDP
    from torch.distributed.fsdp import FSDPModule

    from lmrl.rollout.engines.vllm.engine import model_spec
    from lmrl.rollout.engines.vllm.weights import architecture

    for wrapper in (DDP, FSDPModule):
        model = llama32(len(char_tokenizer()))
        model.__class__ = type(f"{wrapper.__name__}LlamaForCausalLM", (wrapper, type(model)), {})
        assert architecture(model) == model_spec(model)[1] == "LlamaForCausalLM"


def test_lora_on_a_tied_lm_head_is_refused_an_untied_one_is_not():
    peft = pytest.importorskip("peft")
    from lmrl.rollout.engines.vllm.weights import adapts_tied_head

    tok = char_tokenizer()

    def adapted(tied: bool, targets: list[str]):
        model = llama32(len(tok))
        model.config.tie_word_embeddings = tied
        return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets))

    assert adapts_tied_head(adapted(True, ["q_proj", "lm_head"]))
    assert not adapts_tied_head(adapted(True, ["q_proj", "v_proj"]))
    assert not adapts_tied_head(adapted(False, ["q_proj", "lm_head"]))
    assert not adapts_tied_head(llama32(len(tok)))


def test_adapter_sync_is_refused_where_vllm_cannot_serve_the_adapter():
    peft = pytest.importorskip("peft")
    tok = char_tokenizer()
    with pytest.raises(ConfigError, match="vllm_lora_sync=adapter loads the adapters from files .*Fix: "):
        load_config(RLConfig, None, ["engine=vllm", "vllm_lora_sync=adapter", "vllm_server=auto"])
    with pytest.raises(ConfigError, match="vllm_lora_sync=adapter .*colocated on one process"):
        load_config(RLConfig, None, ["engine=vllm", "vllm_lora_sync=adapter", "nproc=2"])  # before torchrun starts
    with pytest.raises(ConfigError, match="trains every weight \\(no LoRA\\). Fix: set lora_r"):
        engines.adapter_rank(llama32(len(tok)))

    def adapted(r: int, targets: list[str], **kwargs):
        return peft.get_peft_model(llama32(len(tok)), peft.LoraConfig(r=r, target_modules=targets, **kwargs))

    assert engines.adapter_rank(adapted(4, ["q_proj", "v_proj"])) == 8  # vLLM's next max_lora_rank
    assert engines.adapter_rank(adapted(16, ["q_proj"])) == 16
    with pytest.raises(ConfigError, match=r"also trains \['lm_head'\]"):
        engines.adapter_rank(adapted(4, ["q_proj", "lm_head"]))
    with pytest.raises(ConfigError, match=r"also trains \['embed_tokens'\]"):
        engines.adapter_rank(adapted(4, ["q_proj"], modules_to_save=["embed_tokens"]))


def test_a_vllm_server_that_does_not_answer_is_a_start_up_error_with_the_command_to_start_one(monkeypatch):
    import socket

    with socket.socket() as sock:  # a free port: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # vllm_server=host:port needs no vLLM in the trainer's environment (this one has none)
    monkeypatch.setattr(engines, "require_vllm", lambda **_: pytest.fail("server mode must not need vLLM here"))
    tok = char_tokenizer()
    config = load_config(RLConfig, None, ["engine=vllm", f"vllm_server=127.0.0.1:{port}"])
    with pytest.raises(
        ConfigError,
        match=rf"no vLLM server answers at http://127.0.0.1:{port}.*"
        rf"lmrl vllm-serve port={port}.*vllm_server=auto",
    ):
        engines.make_engine(config, llama32(len(tok)), tok, None, sampling=SamplingParams(max_new_tokens=8))
    for bad in ("localhost", "host:port", ":80"):
        with pytest.raises(ConfigError, match="vllm_server=.*host:port"):
            load_config(RLConfig, None, [f"vllm_server={bad}"])
    with pytest.raises(ConfigError, match="vllm_sleep=true applies to vLLM in this process"):
        engines.vllm_options(
            load_config(RLConfig, None, ["engine=vllm", "vllm_server=h:1", "vllm_sleep=true"]),
            llama32(len(tok)),
            None,
            SamplingParams(max_new_tokens=8),
        )


def test_a_weight_push_is_split_into_parts_of_at_most_the_limit():
    from lmrl.rollout.engines.vllm.client import split_bytes

    weights = [(f"w{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 5, 5])]  # 4 bytes per element
    parts = [[name for name, _ in part] for part in split_bytes(weights, 80)]
    assert parts == [["w0", "w1"], ["w2"], ["w3", "w4", "w5"]]  # w2 (120 bytes) alone: larger than the limit
    assert [name for part in parts for name in part] == [name for name, _ in weights]
