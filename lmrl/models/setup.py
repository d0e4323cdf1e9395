"""One model setup for every trainer: the policy, frozen reference, value, reward, critic and judge models.

Every model a run uses is loaded here, so what applies to all of them is decided in one place: the
precision (fp32 master weights, bf16 autocast where fast: `lmrl.models.precision`), the device
(`lmrl.models.placement`), LoRA/QLoRA (`lmrl.models.lora`) and gradient checkpointing (`lmrl.models.memory`).

    setup = ModelSetup.from_config(config)        # reads model, tokenizer, model_args, seed, precision
    policy, tokenizer = setup.policy(distribute=False)  # PPO: made data-parallel after the value model copied it
    reference = setup.frozen(config.model, tokenizer)   # KL / DPO reference, avatarl critic, judges
    value = setup.value(policy)                         # PPO value model (a copy of the backbone + a head)
    policy = setup.distribute(policy)                   # several processes: FSDP2 or DDP (`lmrl.parallel.wrap`)
    with setup.autocast():
        ...
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmrl.config import ChatSection, ModelSection, RunSection
from lmrl.data.tokenizers import load_tokenizer
from lmrl.models import memory
from lmrl.models.fused import fuse_layers
from lmrl.models.loading import is_builtin, load_model, load_model_and_tokenizer
from lmrl.models.lora import BaseModelView, apply_lora, unwrap
from lmrl.models.memory import enable_gradient_checkpointing, release_memory_in_layers
from lmrl.models.placement import resolve_device
from lmrl.models.precision import autocast, autocast_dtype, recorded_precision
from lmrl.models.support import check_causal_lm
from lmrl.models.value import ValueModel
from lmrl.parallel import runtime
from lmrl.parallel.config import ParallelSection
from lmrl.parallel.wrap import wrap


@dataclass
class ModelSetup:
    """Loads a run's models with one precision, device, LoRA and checkpointing policy. ``dtype`` is the autocast
    dtype (None: fp32)."""

    model: str = "builtin:tiny"
    tokenizer: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    precision: str = "auto"
    device: str | torch.device = "auto"
    gradient_checkpointing: bool = False
    lora: LoraSettings | None = None
    load_in_4bit: bool = False
    parallel: str = "fsdp"  # with several processes (torchrun): fsdp | ddp (`lmrl.parallel.wrap`)
    fused_layers: bool = True  # RMSNorm and SwiGLU as one autograd op each (`lmrl.models.fused`)
    release_memory: bool = True  # CPU: malloc's free heap handed back every 10 layers (`lmrl.models.memory`)
    chat: bool = True  # prompts through a chat template (false: raw text; no ChatML is installed)
    chat_template: str | None = None  # the model's template: Jinja, a file or chatml (`load_tokenizer`)

    def __post_init__(self) -> None:
        self.device = runtime.init(resolve_device(str(self.device)))  # joins torchrun's process group, if any
        self.sharded: list[torch.nn.Module] = []  # FSDP2-sharded models: unsharded together for sampling and eval
        self.dtype: torch.dtype | None = autocast_dtype(self.precision, self.device)
        self.trained: torch.nn.Module | None = None  # the policy, once loaded (a LoRA reference is a view of it)
        if self.load_in_4bit:
            check_four_bit(self.device, self.model, self.lora)

    @classmethod
    def from_config(cls, config: ModelSection) -> ModelSetup:
        """From a config's model section (`lmrl.config.ModelSection`), its run's ``resume`` and ``output_dir`` (the
        run's recorded precision), its ``parallel`` mode and its ``chat`` key, where the config has those sections."""
        lora = None
        if config.lora_r > 0:
            lora = LoraSettings(
                config.lora_r,
                config.lora_alpha,
                config.lora_dropout,
                list(config.lora_target_modules),
                config.merge_lora,
            )
        if config.huge_pages:  # before any model loads: PyTorch reads it once
            memory.use_huge_pages()
        if config.keep_freed_memory:
            memory.keep_freed_memory()
        precision = config.precision
        if precision == "auto" and isinstance(config, RunSection) and config.resume:  # the run's dtype
            precision = recorded_precision(config.output_dir) or precision
        return cls(
            config.model,
            config.tokenizer,
            dict(config.model_args),
            config.seed,
            precision,
            config.device,
            config.gradient_checkpointing,
            lora,
            config.load_in_4bit,
            config.parallel if isinstance(config, ParallelSection) else "fsdp",
            config.fused_layers,
            config.release_memory,
            config.chat if isinstance(config, ChatSection) else True,
            config.chat_template,
        )

    @property
    def precision_name(self) -> str:
        """What the precision setting resolved to, for the start-up line: 'bf16 autocast' or 'fp32'."""
        return "bf16 autocast" if self.dtype == torch.bfloat16 else "fp32"

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.dtype)

    def policy(self, name: str | None = None, distribute: bool = True) -> tuple[torch.nn.Module, Any]:
        """The trained causal LM and its tokenizer (``name`` default: the config's model), on the device, with
        LoRA adapters (only they train) and gradient checkpointing when configured. The module mode is as
        loaded (HF ``from_pretrained`` gives eval mode: no dropout, as RL wants); SFT-style trainers call
        ``model.train()``. ``distribute=False``: not yet made data-parallel (the caller wraps it, e.g. with a
        reward head, and passes the whole to `distribute`)."""
        own = name in (None, self.model)
        name = name or self.model
        model, tokenizer = load_model_and_tokenizer(
            name,
            self.tokenizer,
            self.seed,
            self.model_args if own else None,
            self.load_in_4bit,
            self.chat,
            self.chat_template,
        )
        check_causal_lm(model, name)
        model = self.prepare(model, base=name)
        self.trained = model
        return (self.distribute(model) if distribute else model), tokenizer

    def distribute(self, model: torch.nn.Module, trainable: bool = True) -> torch.nn.Module:
        """With several processes: FSDP2-shard or DDP-replicate ``model`` in place (`lmrl.parallel.wrap`)."""
        if runtime.world() > 1 and self.lora is not None and self.parallel == "fsdp":
            raise ValueError(
                "LoRA with several processes runs with parallel=ddp (the adapters are small; the frozen "
                "base is not sharded). Fix: add parallel=ddp."
            )
        model = wrap(model, self.parallel, self.dtype, trainable)
        if runtime.world() > 1 and self.parallel == "fsdp":
            self.sharded.append(model)
        return model

    def prepare(self, model: torch.nn.Module, base: str | None = None) -> torch.nn.Module:
        """Apply this setup to a freshly built trainable model: device, fused layers, gradient checkpointing, memory
        release, LoRA."""
        if not self.load_in_4bit:  # a 4-bit model is placed by from_pretrained
            model = model.to(self.device)
        if self.fused_layers:
            fuse_layers(model)
        if self.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        if self.release_memory and self.device.type == "cpu":
            release_memory_in_layers(model)
        if self.lora is not None:
            if self.load_in_4bit:
                from peft import prepare_model_for_kbit_training

                # checkpointing is already lmrl's (`enable_gradient_checkpointing`): HF's would checkpoint twice
                model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
            lora = self.lora
            model = apply_lora(
                model,
                lora.r,
                lora.alpha,
                lora.dropout,
                lora.target_modules,
                {"model": base or self.model, "seed": self.seed, "model_args": self.model_args},
            )
        return model

    def frozen(self, name: str | None, tokenizer, seed: int | None = None) -> torch.nn.Module:
        """A frozen causal LM (eval mode, no gradients): the KL/DPO reference, avatarl's critic, a judge.

        ``name`` default: the config's model (a built-in model is rebuilt from the same seed, so it equals the
        policy's initial weights). With LoRA, the reference to the policy's own base model is the policy with its
        adapters disabled (`BaseModelView`), never a second copy of the weights."""
        name = name or self.model
        if self.lora is not None and name == self.model and self.trained is not None and (seed in (None, self.seed)):
            return BaseModelView(self.trained)
        args = self.model_args if name == self.model else None
        model = load_model(name, tokenizer, seed=self.seed if seed is None else seed, model_args=args)
        return self.distribute(model.to(self.device).eval().requires_grad_(False), trainable=False)

    def frozen_partner(self, path: str, student: torch.nn.Module, tokenizer, role: str, why: str) -> torch.nn.Module:
        """A frozen model (`frozen`) that compares token ids with the student's (avatarl's critic, a distillation
        teacher), checked at start-up to have the same vocabulary size and, when ``path`` holds a tokenizer, the
        same token/id pairs. ``role`` names the config key; ``why`` says why ids must match."""
        model = self.frozen(path, tokenizer)
        theirs, ours = model.config.vocab_size, student.config.vocab_size
        if theirs != ours:
            raise ValueError(
                f"{role} {path!r} has a vocabulary of {theirs} tokens but the student has {ours}. "
                f"{why}, so the {role} must use the student's tokenizer and vocabulary size."
            )
        if any((Path(path) / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
            their_tokens, our_tokens = load_tokenizer(path).get_vocab(), tokenizer.get_vocab()
            if their_tokens != our_tokens:
                differ = sorted(set(their_tokens.items()) ^ set(our_tokens.items()))[:3]
                raise ValueError(
                    f"{role} {path!r} was trained with another tokenizer than the student's (e.g. "
                    f"token/id pairs {differ} are in only one of them). {why}; use the {role}'s "
                    f"tokenizer for the student (tokenizer=...) or retrain the {role}."
                )
        return model

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
        """PPO value model: a copy of the backbone of the policy (``init="policy"``; with LoRA, its own copy of the
        adapters, trained, the base frozen) or of the model at ``init``, plus a zero-initialised scalar head. Several
        processes: made data-parallel like the policy (backbone and head as one module); copy the policy before
        `distribute` wraps it (``policy(distribute=False)``)."""
        source = policy if init == "policy" else load_model(init, tokenizer)
        return self.distribute(ValueModel.from_causal_lm(unwrap(source)).to(self.device))


@dataclass
class LoraSettings:
    r: int
    alpha: float
    dropout: float
    target_modules: list[str]
    merge: bool = False


def check_four_bit(device: torch.device, model: str, lora: LoraSettings | None) -> None:
    """QLoRA's start-up checks: a CUDA device, bitsandbytes installed, an HF model, and LoRA on top."""
    if device.type != "cuda":
        raise ValueError(
            f"load_in_4bit=true needs a CUDA GPU (bitsandbytes' 4-bit kernels); the device is {device}. "
            "Fix: drop load_in_4bit (plain LoRA runs on the CPU), or run on a GPU."
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "load_in_4bit=true needs bitsandbytes. Fix: pip install 'lmrl[qlora]' (or pip install bitsandbytes)."
        ) from exc
    if is_builtin(model):
        raise ValueError(
            "load_in_4bit=true quantizes a pretrained HF model; built-in models are built in fp32. "
            "Fix: model=<an HF model> or drop load_in_4bit."
        )
    if lora is None:
        raise ValueError(
            "load_in_4bit=true freezes the base in 4 bits, so only adapters can train. Fix: set lora_r "
            "(e.g. lora_r=16)."
        )
