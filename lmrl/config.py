"""Typed configs: dataclasses, YAML recipes, ``key=value`` overrides, validation.

Every config field is a YAML key and a command-line override::

    lmrl sft --config sft/tiny_arithmetic lr=3e-4 task_args.digits=3

Unknown keys, wrong types and bad choices fail at start-up with a message that
names the key and the fix (with the closest valid name for typos).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

RECIPES_DIR = Path(__file__).parent / "recipes"


class _Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false. (YAML 1.1 reads off/on/yes/no as booleans,
    which would turn ``dynamic_sampling=off`` into False.)"""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


class ConfigError(ValueError):
    """A config problem found at start-up, with a message that says how to fix it."""


def suggest(name: str, choices: typing.Iterable[str]) -> str:
    """' Did you mean X?' for the closest choice, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def resolve_recipe(recipe: str) -> Path:
    """A recipe is a YAML path or the name of a shipped recipe (``sft/tiny_arithmetic``)."""
    path = Path(recipe)
    if path.is_file():
        return path
    shipped = RECIPES_DIR / (recipe if recipe.endswith(".yaml") else f"{recipe}.yaml")
    if shipped.is_file():
        return shipped
    names = sorted(str(p.relative_to(RECIPES_DIR).with_suffix("")) for p in RECIPES_DIR.rglob("*.yaml"))
    raise ConfigError(
        f"Recipe '{recipe}' is neither a YAML file nor a shipped recipe.{suggest(recipe, names)} "
        f"Shipped recipes: {', '.join(names) or '(none)'}."
    )


def parse_overrides(overrides: typing.Sequence[str]) -> dict[str, Any]:
    """``["lr=1e-4", "task_args.digits=3"]`` -> ``{"lr": 1e-4, "task_args": {"digits": 3}}``.

    Values are parsed as YAML scalars/lists (``true``, ``3``, ``[a, b]``, ``null``).
    """
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"Override '{item}' is not of the form key=value (for example lr=1e-4).")
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("-").replace("-", "_")
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"Override '{item}' sets a sub-key of '{part}', which is not a mapping.")
        node[leaf] = value
    return out


def _merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp``, converting where it is safe (``"1e-4"`` -> float)."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(key, value, option)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"'{key}' must be {_type_name(tp)}, got {value!r}.")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            hint = suggest(str(value), [str(c) for c in choices])
            raise ConfigError(f"'{key}' must be one of {', '.join(map(repr, choices))}; got {value!r}.{hint}")
        return value
    if origin in (list, tuple):
        (inner, *_) = get_args(tp) or (Any,)
        items = value if isinstance(value, (list, tuple)) else [value]
        return [coerce(f"{key}[{i}]", v, inner) for i, v in enumerate(items)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a mapping (YAML dict or {key}.NAME=VALUE overrides), got {value!r}.")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"'{key}' must be true or false, got {value!r}.")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(float(value)) if float(value).is_integer() else int(value)
            except ValueError:
                pass
        raise ConfigError(f"'{key}' must be an integer, got {value!r}.")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"'{key}' must be a number, got {value!r}.")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"'{key}' must be a string, got {value!r}.")
    return value


T = typing.TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build ``cls`` from a plain dict, rejecting unknown keys and wrong types with clear messages."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        raise ConfigError(
            f"Unknown config key '{key}' for {cls.__name__}.{suggest(key, fields)} "
            f"Run with --help-config to list every key."
        )
    values = {k: coerce(k, v, hints[k]) for k, v in data.items()}
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"Invalid {cls.__name__}: {exc}") from exc


def load_config(cls: type[T], recipe: str | None = None, overrides: typing.Sequence[str] = ()) -> T:
    """Recipe YAML (if any), then ``key=value`` overrides, validated into ``cls``."""
    data: dict[str, Any] = {}
    if recipe:
        path = resolve_recipe(recipe)
        try:
            loaded = load_yaml(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"Recipe {path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"Recipe {path} must be a YAML mapping of config keys, got {type(loaded).__name__}.")
        data = loaded
    data = _merge(data, parse_overrides(overrides))
    return from_dict(cls, data)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def describe(cls: type) -> str:
    """One line per field: name, type, default and the field's doc (from ``field(metadata={"help": ...})``)."""
    hints = typing.get_type_hints(cls)
    lines = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)"
        )
        lines.append(f"  {f.name} ({_type_name(hints[f.name])}, default {default!r}): {f.metadata.get('help', '')}")
    return "\n".join(lines)


def field(default: Any, help: str) -> Any:  # noqa: A002 - mirrors argparse's name
    """A dataclass field with a one-line help string (shown by ``--help-config``)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class TrainConfig:
    """Fields every training verb shares. Method configs subclass it and add their own."""

    # model
    model: str = field("builtin:tiny", "HF model path or hub id, a checkpoint dir, or builtin:tiny|small|medium")
    tokenizer: str | None = field(None, "tokenizer path/hub id; default: the model's (builtin models use builtin:char)")
    model_args: dict = field({}, "overrides of the built-in model's architecture (hidden_size, num_hidden_layers, ...)")
    # optimisation
    lr: float = field(1e-3, "peak learning rate (AdamW)")
    weight_decay: float = field(0.0, "AdamW weight decay")
    adam_betas: list[float] = field([0.9, 0.99], "AdamW betas")
    lr_schedule: Literal["cosine", "linear", "constant"] = field("cosine", "decay after warmup")
    warmup_steps: int = field(10, "linear warmup steps from 0 to lr")
    min_lr_ratio: float = field(0.1, "final lr as a fraction of lr (cosine/linear)")
    max_steps: int = field(200, "optimizer steps to train")
    max_grad_norm: float | None = field(1.0, "clip the global gradient norm (null: no clipping)")
    grad_accum: int = field(1, "micro-batches per optimizer step; the batch is split evenly")
    precision: Literal["auto", "bf16", "fp32"] = field("auto", "auto: bf16 autocast where the CPU/GPU supports it; weights stay fp32")
    seed: int = field(0, "seed for data order, init of built-in models and sampling")
    keep_freed_memory: bool = field(True, "CPU: keep freed memory in the process instead of page-faulting it in again every step (glibc mallopt)")
    # run directory and logging
    output_dir: str = field("runs/default", "run directory: config.yaml, metrics.jsonl, samples.jsonl, checkpoints/, plots/")
    resume: bool = field(False, "continue from the newest checkpoint in output_dir")
    overwrite: bool = field(False, "allow starting a fresh run in a non-empty output_dir")
    log_every: int = field(10, "log metrics every N steps")
    eval_every: int = field(100, "evaluate every N steps (0: only at the start and end)")
    save_every: int = field(100, "save a checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = field(2, "how many step-N checkpoints to keep")
    num_samples: int = field(4, "completions written to samples.jsonl at each evaluation")
    report_to: list[str] = field([], "extra trackers: tensorboard, wandb, trackio (when installed)")

    def __post_init__(self) -> None:
        positive = ("lr", "max_steps", "grad_accum", "log_every", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"'{name}' must be > 0, got {getattr(self, name)}.")
        for name in ("warmup_steps", "eval_every", "save_every", "num_samples"):
            if getattr(self, name) < 0:
                raise ConfigError(f"'{name}' must be >= 0, got {getattr(self, name)}.")
        if len(self.adam_betas) != 2:
            raise ConfigError(f"'adam_betas' must be two numbers, got {self.adam_betas}.")
        known = {"tensorboard", "wandb", "trackio"}
        for name in self.report_to:
            if name not in known:
                raise ConfigError(f"'report_to' entry '{name}' is unknown.{suggest(name, known)} Known: {sorted(known)}.")
