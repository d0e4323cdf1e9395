"""Load any HF causal LM (local path, checkpoint dir, hub id or GGUF file) or build a built-in tiny one.

A ``.gguf`` file, or a folder holding one and no config.json, loads through transformers' GGUF reader as a plain fp32
model (`lmrl.models.gguf`).

Built-in models are Llama-style decoders with random init, sized for CPU work:

| name     | hidden | layers | heads | MLP  | params (char vocab) |
|----------|--------|--------|-------|------|---------------------|
| tiny     | 128    | 4      | 4     | 512  | ~1.1M               |
| small    | 256    | 6      | 8     | 1024 | ~6.3M               |
| medium   | 384    | 8      | 8     | 1536 | ~19M                |
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)

from lmrl.data.tokenizers import BUILTIN_TOKENIZERS, load_tokenizer
from lmrl.models import lora
from lmrl.models.attention import use_fp32_cpu_attention
from lmrl.models.gguf import check_gguf, gguf_file, load_gguf_config, load_gguf_model
from lmrl.models.saving import save_model  # noqa: F401 - re-exported: lmrl.models.loading.save_model

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS: dict[str, dict] = {
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512),
    "small": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, intermediate_size=1024),
    "medium": dict(hidden_size=384, num_hidden_layers=8, num_attention_heads=8, intermediate_size=1536),
}
BUILTIN_TOKENIZER = "builtin:char"


def is_builtin(name: str) -> bool:
    """``builtin:<size>`` names a built-in model (``builtin:char``/``builtin:bpe`` are tokenizers)."""
    return name.startswith(BUILTIN_PREFIX) and name not in BUILTIN_TOKENIZERS


def default_tokenizer_name(model: str) -> str:
    """Built-in models use the built-in char tokenizer; HF models their own."""
    return BUILTIN_TOKENIZER if is_builtin(model) else model


def builtin_config(name: str, vocab_size: int, pad_token_id: int, eos_token_id: int, **overrides) -> LlamaConfig:
    size = name.removeprefix(BUILTIN_PREFIX)
    if size not in BUILTIN_MODELS:
        raise ValueError(
            f"Unknown built-in model '{name}'. Built-in models: "
            + ", ".join(f"builtin:{k}" for k in BUILTIN_MODELS)
            + ". For a Hugging Face model give its local path or hub id."
        )
    args = dict(
        vocab_size=vocab_size,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        **BUILTIN_MODELS[size],
    )
    unknown = set(overrides) - set(LlamaConfig().to_dict())
    if unknown:
        raise ValueError(
            f"model_args {sorted(unknown)} are not LlamaConfig fields (e.g. hidden_size, num_hidden_layers)."
        )
    args.update(overrides)
    return LlamaConfig(**args)


def check_model_path(name: str) -> None:
    """Fail early and clearly on a local-looking path that does not exist, or on a hub id that is not in the HF
    cache while the hub is unreachable (offline, the hub client retries for ~50 s before it gives up)."""
    looks_local = name.startswith((".", "/", "~")) or not _is_repo_id(name)  # 'Qwen/Qwen2.5-0.5B' is a hub id
    if looks_local and not Path(name).expanduser().exists():
        raise FileNotFoundError(
            f"Model path '{name}' does not exist. Give an existing local directory (for example "
            f"runs/sft/final), a Hugging Face hub id (org/name), or a built-in model ({_builtin_names()})."
        )
    if Path(name).expanduser().exists():
        check_local_model(name)
    if not looks_local and not Path(name).exists() and not _hub_cached(name) and not _hub_reachable():
        raise FileNotFoundError(_not_found(name, "the hub is unreachable (no network or HF_HUB_OFFLINE=1)"))


def check_local_model(name: str) -> None:
    """An existing local model path is a .gguf file that transformers reads, or a folder with config.json (an HF
    model), adapter_config.json (a LoRA adapter) or exactly one .gguf file."""
    path = Path(name).expanduser()
    gguf = gguf_file(name)  # raises on a folder with several
    if gguf is not None:
        check_gguf(gguf)
    elif path.is_file():
        raise FileNotFoundError(
            f"Model path '{name}' is a file but not a .gguf file. Fix: give a model folder "
            "(config.json and weights, for example runs/sft/final) or a .gguf file."
        )
    elif not any((path / f).exists() for f in ("config.json", "adapter_config.json")):
        raise FileNotFoundError(
            f"Model folder '{name}' holds neither config.json (an HF model) nor a .gguf file. "
            "Fix: give a folder with config.json and weights (for example runs/sft/final), a "
            ".gguf file, or a folder holding one."
        )


def load_hf_config(name: str):
    """The transformers config of an HF model (folder or hub id) or of a GGUF file, without loading weights."""
    gguf = gguf_file(name)
    if gguf is not None:
        return load_gguf_config(gguf)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(name)


def _is_repo_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _builtin_names() -> str:
    return ", ".join("builtin:" + k for k in BUILTIN_MODELS)


def _not_found(name: str, why: str) -> str:
    return (
        f"Model '{name}' is neither a local directory nor in the Hugging Face cache, and {why}.\n"
        f"Fix: give a local model directory, run `hf download {name}` (or huggingface-cli download) where there "
        f"is network and copy the HF cache here, or use a built-in model ({_builtin_names()})."
    )


def _hub_cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def _hub_reachable() -> bool:
    """False when offline mode is on or the hub's host does not resolve (a proxy counts as reachable)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    try:
        socket.getaddrinfo(urlparse(constants.ENDPOINT).hostname, 443)
    except OSError:
        return False
    return True


def load_model(
    name: str, tokenizer=None, seed: int = 0, model_args: dict | None = None, load_in_4bit: bool = False
) -> PreTrainedModel:
    """A causal LM in fp32 (weights are the master copy; compute runs under autocast).

    ``builtin:<size>`` builds a fresh random model for ``tokenizer`` (seeded by ``seed``); a LoRA adapter directory
    loads as its base with the adapter merged (`lmrl.models.lora`); a GGUF file de-quantized (`lmrl.models.gguf`);
    anything else goes to ``AutoModelForCausalLM.from_pretrained`` (``load_in_4bit``: NF4 weights via
    bitsandbytes, QLoRA's base).
    """
    if not is_builtin(name) and lora.is_adapter_dir(name):
        base, seed, model_args = lora.adapter_base(name)
        model = lora.merge_adapter_dir(load_model(base, tokenizer, seed=seed, model_args=model_args), name)
        use_fp32_cpu_attention(model)
        return model
    if is_builtin(name):
        if tokenizer is None:
            tokenizer = load_tokenizer(BUILTIN_TOKENIZER)
        config = builtin_config(
            name, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, **(model_args or {})
        )
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
        use_fp32_cpu_attention(model)
        return model
    if model_args:
        raise ValueError("model_args only apply to built-in models; edit the model's config.json instead.")
    check_model_path(name)
    gguf = gguf_file(name)
    if gguf is not None:
        if load_in_4bit:
            raise ValueError(
                f"load_in_4bit=true quantizes an HF model folder; '{name}' is a GGUF file, which loads "
                "de-quantized. Fix: drop load_in_4bit, or give an HF folder (e.g. the final/ of a run on it)."
            )
        model = load_gguf_model(gguf)
    else:
        model = _from_pretrained(name, load_in_4bit)
    fit_added_tokens(model, tokenizer)
    use_fp32_cpu_attention(model)
    return model


def _from_pretrained(name: str, load_in_4bit: bool) -> PreTrainedModel:
    extra = {}
    if load_in_4bit:  # placed on the current GPU by from_pretrained, as TRL's get_kbit_device_map does
        extra = {
            "quantization_config": four_bit_config(),
            "dtype": torch.bfloat16,
            "device_map": {"": torch.cuda.current_device()},
        }
    from safetensors import SafetensorError

    try:
        return AutoModelForCausalLM.from_pretrained(name, **{"dtype": torch.float32, **extra})
    except SafetensorError as exc:  # a cut or damaged weights file (a copy or download that did not finish)
        raise ValueError(
            f"The weights of model '{name}' are damaged or incomplete ({exc}). Fix: copy or download "
            "the model again, or use another checkpoint of the run (checkpoints/step-N)."
        ) from None
    except OSError as exc:
        first = f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0][:200]
        if Path(name).expanduser().exists():
            raise FileNotFoundError(
                f"Could not load model from the local directory '{name}' ({first}).\n"
                "Fix: point at a directory with config.json and weights (for example runs/sft/final)."
            ) from exc
        raise FileNotFoundError(_not_found(name, f"loading it failed ({first})")) from exc


def fit_added_tokens(model: PreTrainedModel, tokenizer) -> None:
    """Resize the embeddings (and LM head) to ``len(tokenizer)`` when lmrl added ChatML tokens the model has no
    rows for (`lmrl.data.chat.ensure_chat_template`); the new rows start at the mean of the old ones."""
    if tokenizer is None or not getattr(tokenizer, "lmrl_added_tokens", None):
        return
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))


def four_bit_config():
    """QLoRA's base quantization: NF4 weights, double quantization, bf16 compute (Dettmers et al. 2023)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def load_model_and_tokenizer(
    name: str,
    tokenizer_name: str | None = None,
    seed: int = 0,
    model_args: dict | None = None,
    load_in_4bit: bool = False,
    chat: bool = True,
    chat_template: str | None = None,
):
    """The model and its tokenizer (built-in models get ``builtin:char`` unless told otherwise; ``chat``,
    ``chat_template``: `lmrl.data.tokenizers.load_tokenizer`)."""
    if not is_builtin(name):
        check_model_path(name)
    tokenizer = load_tokenizer(tokenizer_name or default_tokenizer_name(name), chat, chat_template)
    model = load_model(name, tokenizer, seed=seed, model_args=model_args, load_in_4bit=load_in_4bit)
    check_vocab(model, tokenizer, name)
    return model, tokenizer


def check_vocab(model: torch.nn.Module, tokenizer, name: str) -> None:
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(
            f"Tokenizer has {len(tokenizer)} tokens but model '{name}' has only {model.config.vocab_size} embeddings; "
            f"use the model's own tokenizer."
        )


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def describe_parameters(model: torch.nn.Module) -> str:
    """'1.25M params', or with frozen weights (LoRA) '1.25M params (47.1K trainable)'."""
    total = count_parameters(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    text = f"{total / 1e6:.2f}M params"
    if trainable == total:
        return text
    return (
        f"{text} ({trainable / 1e6:.1f}M trainable)"
        if trainable >= 1e6
        else f"{text} ({trainable / 1e3:.1f}K trainable)"
    )
