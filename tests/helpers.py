"""What many tests share, imported as `from tests.helpers import ...` (as tests/rounding.py is): the overrides that
make a CLI or config run tiny, a toy reward, tiny random models. Fixtures are in tests/conftest.py."""

from __future__ import annotations

TINY_ARGS = {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 2}
"""`model_args` of the tiny test model (`model=builtin:tiny`): 2 layers of width 32, head size 16."""
TINY = [f"model_args.{key}={value}" for key, value in TINY_ARGS.items()]
"""TINY_ARGS as config overrides."""
ONE_LAYER_ARGS = {**TINY_ARGS, "num_hidden_layers": 1}
"""The tiny test model with one layer: the fastest that still trains."""
ONE_LAYER = [f"model_args.{key}={value}" for key, value in ONE_LAYER_ARGS.items()]
VLLM_TINY_ARGS = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 2}
"""The tiny model with head size 32: vLLM's CPU attention runs head sizes 32, 64, 80, ... (not TINY's 16)."""
VLLM_TINY = [f"model_args.{key}={value}" for key, value in VLLM_TINY_ARGS.items()]

RL_RUN = [
    "task_args.digits=1",
    "train_rows=64",
    "eval_rows=8",
    "prompts_per_step=4",
    "samples_per_prompt=4",
    "max_new_tokens=6",
]
"""A small RL run: 1-digit arithmetic, 4 prompts x 4 samples a step, 6 new tokens each."""
RL_SMOKE = [
    "task_args.digits=1",
    "train_rows=16",
    "eval_rows=4",
    "prompts_per_step=2",
    "samples_per_prompt=2",
    "max_new_tokens=4",
]
"""The smallest RL run: 2 prompts x 2 samples a step, 4 new tokens each."""
PREFERENCE_RUN = [
    "train_rows=48",
    "eval_rows=16",
    "batch_size=8",
    "eval_every=0",
    "save_every=0",
    "log_every=1",
    "eval_max_new_tokens=4",
]
"""A small preference run (dpo, reward): batches of 8 pairs, no evaluation during training."""
TOOL_RUN = [
    "dataset=task:tool_arithmetic",
    "task_args={digits: 2}",
    "tools=[calculator]",
    "tool_parser=pythonic",
    "max_turns=2",
    "max_total_tokens=60",
    "max_new_tokens=24",
]
"""Tool episodes: 2-digit arithmetic with the calculator called in pythonic syntax, 2 turns, 60 tokens in all."""
DISTILL_RUN = [
    "batch_size=8",
    "lr=1e-2",
    "warmup_steps=0",
    "max_new_tokens=8",
    "eval_max_new_tokens=8",
    "save_every=0",
    "log_every=1",
    "num_samples=1",
]
"""A small distillation run: batches of 8, 8 new tokens when it samples."""


def digit_fraction(prompts, completions, **kwargs) -> list[float]:
    """A dense toy reward a random model can improve on: the share of completion characters that are digits."""
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]


def has_digit(prompts, completions, **kwargs) -> list[float]:
    """A 0/1 toy reward whose groups are often all equal (DAPO drops them): 1 if a completion has a digit."""
    return [float(any(c.isdigit() for c in text)) for text in completions]


def register_once(name: str, reward) -> None:
    """Register the plain function ``reward`` as the reward ``name`` (once per process; tests import twice)."""
    from lmrl.rewards import REWARDS, register_reward

    if name not in REWARDS:
        register_reward(name)(lambda **_: reward)


HAND_TOL = dict(rtol=0, atol=1e-9)
"""`torch.testing.assert_close` tolerance of a float64 loss against its value computed by hand."""


def float64(*values):
    """A float64 tensor of ``values`` (a loss's inputs, its hand-computed value)."""
    import torch

    return torch.tensor(values, dtype=torch.float64)


def float64_scalar(value):
    """A 0-dim float64 tensor."""
    import torch

    return torch.tensor(value, dtype=torch.float64)


SMALL_DECODER = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128
)
"""tiny_llama's decoder, for any Llama-like config: 2 layers of width 64, 4 heads of 16 sharing 2 KV heads."""


def tiny_llama(vocab: int = 97, seed: int = 0, **config):
    """A random Llama from ``seed`` in eval mode: 2 layers of width 64, 4 heads of 16 sharing 2 KV heads, 128
    positions; ``config`` adds or overrides LlamaConfig keys (token ids, sizes, tied head)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(vocab_size=vocab, **{**SMALL_DECODER, "max_position_embeddings": 128, **config})
    ).eval()


def tiny_gpt2(vocab: int = 97, seed: int = 0, **config):
    """A random GPT-2 from ``seed`` in eval mode: 2 layers of width 64, 4 heads, 128 absolute positions (wrong
    position_ids change every logit; with RoPE a per-row offset cancels); ``config`` adds GPT2Config keys."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(
        GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=128, **config)
    ).eval()
