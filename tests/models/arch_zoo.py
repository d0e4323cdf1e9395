"""Tiny random models of the common architectures, built locally from transformers config classes (no downloads).

Each entry gives a config of a few tens of thousands of parameters that keeps what makes the architecture itself:
its attention (GQA, sliding windows, soft-capping), its MLP (MoE experts), its head (tied or untied, logit scaling)
and its layer code (GPT-2's Conv1D, OPT's dropout, Falcon's fused QKV). `save_model_dir` writes one with the
built-in char tokenizer as an HF model folder, which every lmrl verb takes as `model=`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from lmrl.data.tokenizers import load_tokenizer

HIDDEN, LAYERS, HEADS, KV_HEADS, MLP = 32, 2, 4, 2, 64
COMMON = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=MLP,
    max_position_embeddings=256,
)
GQA = dict(COMMON, num_key_value_heads=KV_HEADS)

# name -> (config class, its arguments); tied heads unless the name says untied
ARCHITECTURES: dict[str, tuple[str, dict]] = {
    "gpt2": ("GPT2Config", dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=256)),
    "llama": ("LlamaConfig", dict(GQA, tie_word_embeddings=True)),
    "llama-untied": ("LlamaConfig", dict(GQA, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", dict(GQA, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(GQA, head_dim=8, tie_word_embeddings=False)),
    "mistral-sliding": ("MistralConfig", dict(GQA, sliding_window=8, tie_word_embeddings=False)),
    "gemma2": (
        "Gemma2Config",
        dict(
            GQA,
            head_dim=8,
            sliding_window=8,
            final_logit_softcapping=30.0,
            attn_logit_softcapping=50.0,
            query_pre_attn_scalar=8,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            GQA,
            head_dim=8,
            sliding_window=8,
            query_pre_attn_scalar=8,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    "phi3": ("Phi3Config", dict(GQA, tie_word_embeddings=False)),
    "opt-dropout": (
        "OPTConfig",
        dict(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            ffn_dim=MLP,
            word_embed_proj_dim=HIDDEN,
            max_position_embeddings=256,
            dropout=0.1,
            attention_dropout=0.1,
        ),
    ),
    "gpt-neox": ("GPTNeoXConfig", dict(COMMON, tie_word_embeddings=False)),
    "olmo2": ("Olmo2Config", dict(GQA, tie_word_embeddings=False)),
    "granite": ("GraniteConfig", dict(GQA, logits_scaling=4.0, tie_word_embeddings=True)),
    "falcon": (
        "FalconConfig",
        dict(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            new_decoder_architecture=False,
            multi_query=True,
            parallel_attn=True,
            max_position_embeddings=256,
        ),
    ),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        dict(
            GQA,
            head_dim=8,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            tie_word_embeddings=False,
        ),
    ),
}


def build_config(name: str, tokenizer):
    class_name, args = ARCHITECTURES[name]
    config_class = getattr(transformers, class_name)
    ids = dict(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id
    )
    return config_class(vocab_size=len(tokenizer), **ids, **args)


def build_model(name: str, tokenizer, seed: int = 0):
    """A random model of architecture ``name`` for ``tokenizer``, in eval mode."""
    config = build_config(name, tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model.eval()


def save_model_dir(name: str, directory: Path, seed: int = 0) -> Path:
    """``directory`` holding a random ``name`` model and the built-in char tokenizer, in HF format."""
    tokenizer = load_tokenizer("builtin:char")
    build_model(name, tokenizer, seed).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
