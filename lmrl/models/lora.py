"""LoRA and QLoRA through `peft` (Hu et al. 2021, "LoRA"; Dettmers et al. 2023, "QLoRA").

W x + (alpha / r) B A x, with A (r, in) and B (out, r) trained and W frozen (B starts at 0, so training starts from
the base model exactly). `ModelSetup` applies it to the policy of every trainer; what follows from it:

- the reference model for KL and DPO is the policy with its adapters disabled (`BaseModelView`): no second copy of
  the weights;
- a checkpoint holds the trainable tensors (adapters, value/reward heads) by name, restored exactly on resume
  (`trainable_state_dict`); `final/` holds the adapter (`save_pretrained`), or the merged HF model with
  `merge_lora=true` (the adapter then in `final/adapter/`);
- a directory with an adapter (`adapter_config.json`) loads as its base model with the adapter merged in
  (`load_adapter_dir`), so `model=<run>/final` works in every verb.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lmrl.models.saving import save_model

BASE_FILE = "lmrl_base.json"  # how to rebuild the base of an adapter: model name, seed, model_args
TRAINABLE_FILE = "trainable.safetensors"
INSTALL_HINT = "pip install 'lmrl[lora]' (or pip install peft)"


def require_peft() -> None:
    try:
        import peft  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"LoRA (lora_r > 0) needs peft, which is not installed. Fix: {INSTALL_HINT}.") from exc


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct leaf names of the model's nn.Linear layers (q_proj, k_proj, ..., lm_head), in order."""
    names: dict[str, None] = {}
    for full, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) or type(module).__name__ in ("Linear4bit", "Linear8bitLt", "Conv1D"):
            names[full.rsplit(".", 1)[-1]] = None
    return list(names)


def check_target_modules(model: torch.nn.Module, targets: list[str]) -> None:
    """Every requested LoRA target must name linear layers of the model ("all-linear": every one but the LM head)."""
    if targets == ["all-linear"]:
        return
    available = linear_module_names(model)
    missing = [t for t in targets if t not in available]
    if missing:
        raise ValueError(
            f"lora_target_modules {missing} are not linear layers of this model. Its linear layers: "
            f"{', '.join(available)}. Fix: pick from those, or lora_target_modules=[all-linear]."
        )


def expert_parameters(model: torch.nn.Module) -> list[str]:
    """The fused MoE expert weights of ``model`` (3-D parameters such as ``experts.gate_up_proj`` (E, 2I, H)), by
    ``module.parameter`` name: not nn.Linear layers, so peft's "all-linear" leaves them out and LoRA targets them
    as parameters (peft >= 0.17 `target_parameters`); without that, the experts would stay frozen."""
    names: dict[str, None] = {}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if param.dim() == 3:
                names[f"{module_name.rsplit('.', 1)[-1]}.{name}"] = None
    if names:
        import peft
        from packaging.version import Version

        if Version(peft.__version__) < Version("0.17"):
            raise ValueError(
                f"LoRA on this MoE model needs peft >= 0.17 to train its experts {list(names)} "
                f"(peft {peft.__version__} would leave them frozen). Fix: pip install -U peft."
            )
    return list(names)


def apply_lora(
    model: torch.nn.Module, r: int, alpha: float, dropout: float, targets: list[str], base: dict[str, Any]
) -> torch.nn.Module:
    """``model`` wrapped with LoRA adapters on ``targets`` (peft `get_peft_model`); only the adapters train. The
    adapters are initialised from ``base["seed"]`` (the global RNG is left as it was) and every module keeps its
    train/eval mode. ``base`` ({model, seed, model_args}) is kept with the adapter so it can be loaded again."""
    require_peft()
    from peft import LoraConfig, get_peft_model

    check_target_modules(model, targets)
    target = "all-linear" if targets == ["all-linear"] else list(targets)
    extra = {"target_parameters": expert_parameters(model)} if targets == ["all-linear"] else {}
    if extra and not extra["target_parameters"]:
        extra = {}
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target,
        task_type="CAUSAL_LM",
        base_model_name_or_path=str(base["model"]),
        **extra,
    )
    modes = {name: module.training for name, module in model.named_modules()}
    with torch.random.fork_rng():  # A's random init from the run's seed: the same adapters every run
        torch.manual_seed(int(base.get("seed", 0)))
        peft_model = get_peft_model(model, config)
    # peft creates its wrapper and adapters in training mode: the model keeps the mode it had (RL: eval, no dropout)
    peft_model.train(model.training)
    for name, module in model.named_modules():
        module.training = modes.get(name, model.training)
    peft_model.lmrl_base = dict(base)
    return peft_model


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The HF causal LM inside a peft wrapper (its LoRA layers included), or the model itself."""
    return model.get_base_model() if is_peft(model) else model


class BaseModelView(torch.nn.Module):
    """The policy with its adapters disabled: the frozen reference of a LoRA run, sharing the base weights.

    Its forward runs the policy under `disable_adapter()`; the policy is not registered as a submodule, so
    `.eval()`/`.requires_grad_(False)` on the view leave the policy as it is. Use it under `torch.no_grad()`.
    """

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "policy", policy)

    @property
    def config(self):
        return self.policy.config

    def get_base_model(self) -> torch.nn.Module:  # lets `accepts_kwarg` read the base model's signature
        return unwrap(self.policy)

    def parameters(self, recurse: bool = True):  # the device and dtype of the policy's weights
        return self.policy.parameters(recurse)

    def forward(self, *args, **kwargs):
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)


def trainable_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train (LoRA adapters, value/reward heads), by name, detached and contiguous."""
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def has_frozen_weights(model: torch.nn.Module) -> bool:
    return any(not p.requires_grad for p in model.parameters())


def save_trainable(model: torch.nn.Module, directory: Path) -> None:
    from safetensors.torch import save_file

    save_file(trainable_state_dict(model), str(directory / TRAINABLE_FILE))


def load_trainable(model: torch.nn.Module, directory: Path) -> None:
    """Restore the trainable tensors saved by `save_trainable`; every one of them must be there, by name."""
    from safetensors.torch import load_file

    weights = load_file(str(directory / TRAINABLE_FILE))
    expected = set(trainable_state_dict(model))
    if set(weights) != expected:
        missing, unexpected = sorted(expected - set(weights))[:5], sorted(set(weights) - expected)[:5]
        raise RuntimeError(
            f"Checkpoint {directory} does not match the model's trainable parameters (LoRA settings "
            f"changed?): missing {missing}, unexpected {unexpected}."
        )
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)


def save_adapter(model: torch.nn.Module, tokenizer, directory: Path, merge: bool) -> Path:
    """``directory``: the adapter (+ tokenizer and `lmrl_base.json`), or with ``merge`` the merged HF model and the
    adapter in ``directory/adapter``. The policy itself is left unmerged."""
    adapter_dir = directory / "adapter" if merge else directory
    save_model(model, tokenizer, adapter_dir)
    (adapter_dir / BASE_FILE).write_text(json.dumps(getattr(model, "lmrl_base", {})))
    if merge:
        merged = merged_copy(model)
        save_model(merged, tokenizer, directory)
    return directory


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain HF model with the adapters folded into the weights (W + alpha/r B A); ``model`` is unchanged."""
    import copy

    return copy.deepcopy(model).merge_and_unload()


def is_adapter_dir(path: str | Path) -> bool:
    path = Path(path).expanduser()
    return (path / "adapter_config.json").exists() and not (path / "config.json").exists()


def adapter_base(path: str | Path) -> tuple[str, int, dict | None]:
    """(base model name, seed, model_args) of an adapter directory, for `lmrl.models.loading.load_model`."""
    path = Path(path).expanduser()
    base = json.loads((path / BASE_FILE).read_text()) if (path / BASE_FILE).exists() else {}
    name = base.get("model") or json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not name:
        raise FileNotFoundError(
            f"Adapter '{path}' does not name its base model (adapter_config.json: "
            "base_model_name_or_path). Fix: load the base with model=... and merge the adapter."
        )
    return name, base.get("seed", 0), base.get("model_args") or None


def merge_adapter_dir(model: torch.nn.Module, path: str | Path) -> torch.nn.Module:
    """``model`` (the adapter's base) with the adapter of ``path`` merged in (for sampling, references, judges)."""
    require_peft()
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(Path(path).expanduser())).merge_and_unload()
