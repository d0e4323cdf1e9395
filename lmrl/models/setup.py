"""One model setup for every trainer: the policy, frozen reference, value, reward, critic and judge models.

Every model a run uses is loaded here, so what applies to all of them is decided in one place: the
precision (fp32 master weights, bf16 autocast where fast: `lmrl.models.precision`) and, as they land,
device placement, LoRA and gradient checkpointing.

    setup = ModelSetup.from_config(config)        # reads model, tokenizer, model_args, seed, precision
    policy, tokenizer = setup.policy()
    reference = setup.frozen(config.model, tokenizer)   # KL / DPO reference, avatarl critic, judges
    value = setup.value(policy)                         # PPO value model (a copy of the backbone + a head)
    with setup.autocast():
        ...
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from lmrl.models.loading import load_model, load_model_and_tokenizer
from lmrl.models.precision import autocast, autocast_dtype
from lmrl.models.value import ValueModel


@dataclass
class ModelSetup:
    """Loads a run's models with one precision policy. ``dtype`` is the autocast dtype (None: fp32)."""

    model: str = "builtin:tiny"
    tokenizer: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    precision: str = "auto"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        self.dtype: torch.dtype | None = autocast_dtype(self.precision, self.device)

    @classmethod
    def from_config(cls, config: Any) -> ModelSetup:
        """From any config with the model section's keys (`lmrl.config.ModelSection`)."""
        return cls(config.model, config.tokenizer, dict(config.model_args), config.seed, config.precision)

    @property
    def precision_name(self) -> str:
        """What the precision setting resolved to, for the start-up line: 'bf16 autocast' or 'fp32'."""
        return "bf16 autocast" if self.dtype == torch.bfloat16 else "fp32"

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.dtype)

    def policy(self, name: str | None = None) -> tuple[torch.nn.Module, Any]:
        """The trained causal LM and its tokenizer (``name`` default: the config's model). The module mode is as
        loaded (HF ``from_pretrained`` gives eval mode: no dropout, as RL wants); SFT-style trainers call
        ``model.train()``."""
        model, tokenizer = load_model_and_tokenizer(name or self.model, self.tokenizer, self.seed,
                                                    self.model_args if name in (None, self.model) else None)
        return model.to(self.device), tokenizer

    def frozen(self, name: str | None, tokenizer, seed: int | None = None) -> torch.nn.Module:
        """A frozen causal LM (eval mode, no gradients): the KL/DPO reference, avatarl's critic, a judge.

        ``name`` default: the config's model (a built-in model is rebuilt from the same seed, so it equals the
        policy's initial weights)."""
        name = name or self.model
        args = self.model_args if name == self.model else None
        model = load_model(name, tokenizer, seed=self.seed if seed is None else seed, model_args=args)
        return model.to(self.device).eval().requires_grad_(False)

    def judge(self, name: str, seed: int | None = None) -> tuple[torch.nn.Module, Any]:
        """A frozen causal LM with its own tokenizer: an LLM judge or a self-reward model."""
        model, tokenizer = load_model_and_tokenizer(name, seed=self.seed if seed is None else seed)
        return model.to(self.device).eval().requires_grad_(False), tokenizer

    def reward_model(self, path: str) -> tuple[torch.nn.Module, Any]:
        """A trained reward model (`lmrl.models.reward`) and its tokenizer, frozen."""
        from lmrl.models.reward import load_reward_model

        model, tokenizer = load_reward_model(path)
        return model.to(self.device).eval().requires_grad_(False), tokenizer

    def value(self, policy: torch.nn.Module, init: str = "policy", tokenizer=None) -> ValueModel:
        """PPO value model: a copy of the backbone of the policy (``init="policy"``) or of the model at ``init``,
        plus a zero-initialised scalar head."""
        source = policy if init == "policy" else load_model(init, tokenizer)
        return ValueModel.from_causal_lm(source).to(self.device)
