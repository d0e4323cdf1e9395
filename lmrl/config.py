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
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from lmrl.config_base import ConfigError, Section, check_at_least, check_output_dir, expand_home, field, finite  # noqa
from lmrl.parallel.config import ParallelSection

RECIPES_DIR = Path(__file__).parent / "recipes"


class _Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false. (YAML 1.1 reads off/on/yes/no as booleans: ``dynamic_sampling=off``.)"""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


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
        try:
            number = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None:
            raise ConfigError(f"'{key}' must be a number, got {value!r}.")
        return finite(key, number)
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return expand_home(key, str(value))
        raise ConfigError(f"'{key}' must be a string, got {value!r}.")
    return value


T = typing.TypeVar("T")


ALIASES: dict[str, str] = {
    # TRL / HF TrainingArguments name -> lmrl name
    "learning_rate": "lr",
    "num_generations": "samples_per_prompt",
    "max_completion_length": "max_new_tokens",
    "gradient_accumulation_steps": "grad_accum",
    "beta": "kl_coef",
    "lr_scheduler_type": "lr_schedule",
    "num_iterations": "ppo_epochs",
    "epsilon": "clip_low",
    "epsilon_high": "clip_high",
    "logging_steps": "log_every",
    "eval_steps": "eval_every",
    "save_steps": "save_every",
    "save_total_limit": "keep_checkpoints",
}
"""Names users bring from TRL and HF ``TrainingArguments``, accepted where the config has the lmrl name and not
the alias itself (``beta`` is DPO's own key, and ``kl_coef`` in ``lmrl rl``)."""

ALIAS_VALUES: dict[str, dict[Any, Any]] = {"lr_scheduler_type": {"constant_with_warmup": "constant", "cosine_with_min_lr": "cosine"}}


def resolve_aliases(cls: type, data: dict[str, Any], notify: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Rename the TRL/HF aliases in ``data`` to ``cls``'s keys, with a one-line notice each."""
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    out = dict(data)
    for alias, name in ALIASES.items():
        if alias not in out or alias in fields or name not in fields:
            continue
        if name in out:
            raise ConfigError(f"Both '{alias}' (TRL's name) and '{name}' are set; keep one ('{name}').")
        value = out.pop(alias)
        out[name] = ALIAS_VALUES.get(alias, {}).get(value, value) if isinstance(value, str) else value
        (notify or _notice)(f"note: '{alias}' is read as lmrl's '{name}' ({name}={out[name]})")
    return out


def _notice(text: str) -> None:
    print(text, file=sys.stderr)


def unknown_key_message(key: str, cls: type) -> str:
    """'Unknown config key ...' with the closest key or alias (an alias suggests the key it stands for)."""
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    names = fields + [a for a, n in ALIASES.items() if n in fields and a not in fields]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = ""
    if close:
        target = close[0] if close[0] in fields else ALIASES[close[0]]
        hint = f" Did you mean '{target}'?" + (f" ('{close[0]}' in TRL)" if target != close[0] else "")
    return f"Unknown config key '{key}' for {cls.__name__}.{hint} Run with --help-config to list every key."


def from_dict(cls: type[T], data: dict[str, Any], notify: Callable[[str], None] | None = None) -> T:
    """Build ``cls`` from a plain dict, rejecting unknown keys and wrong types with clear messages."""
    data = resolve_aliases(cls, data, notify)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise ConfigError(unknown_key_message(unknown[0], cls))
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
        data = resolve_aliases(cls, loaded)
    # aliases resolved per layer, so `num_generations=4` on the command line overrides a recipe's samples_per_prompt
    data = _merge(data, resolve_aliases(cls, parse_overrides(overrides)))
    return from_dict(cls, data)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def section_of(cls: type, name: str) -> str:
    """The title of the section that first declares ``name`` (the method's own keys: '')."""
    for base in reversed(cls.__mro__):
        if issubclass(base, Section) and base.__dict__.get("title") and name in base.__dict__.get("__annotations__", {}):
            return base.title
    return ""


def describe(cls: type) -> str:
    """The keys grouped by section, one line each: name, type, default and the field's help."""
    hints = typing.get_type_hints(cls)
    groups: dict[str, list[str]] = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)"
        )
        line = f"  {f.name} ({_type_name(hints[f.name])}, default {default!r}): {f.metadata.get('help', '')}"
        groups.setdefault(section_of(cls, f.name), []).append(line)
    own = groups.pop("", [])
    parts = [f"{cls.__name__.removesuffix('Config') or cls.__name__}:\n" + "\n".join(own)] if own else []
    parts += [f"{title}:\n" + "\n".join(lines) for title, lines in groups.items()]
    aliases = [f"{a} -> {n}" for a, n in ALIASES.items() if n in hints and a not in hints]
    if aliases:
        parts.append("TRL/HF names accepted: " + ", ".join(aliases))
    return "\n\n".join(parts)


@dataclasses.dataclass
class ModelSection(Section):
    title = "model"
    model: str = field("builtin:tiny", "HF model path or hub id, a checkpoint dir, or builtin:tiny|small|medium")
    tokenizer: str | None = field(None, "tokenizer path/hub id; default: the model's (builtin models use builtin:char)")
    model_args: dict = field({}, "overrides of the built-in model's architecture (hidden_size, num_hidden_layers, ...)")
    precision: Literal["auto", "bf16", "fp32"] = field("auto", "auto: bf16 autocast where the CPU/GPU supports it; weights stay fp32")
    seed: int = field(0, "seed for data order, init of built-in models and sampling")
    keep_freed_memory: bool = field(True, "CPU: keep freed memory in the process instead of page-faulting it in again every step (glibc mallopt)")
    device: str = field("auto", "auto (CUDA when available, else CPU) | cpu | cuda | cuda:N: every model of the run goes there")
    gradient_checkpointing: bool = field(False, "recompute each layer's activations in the backward (less memory, ~30% more compute)")
    logprob_chunk_mb: float = field(128, "most memory one chunk of fp32 logits may take: the LM head, log-softmax and entropy run chunk by chunk in forward and backward")
    lora_r: int = field(0, "LoRA rank (0: train every weight); with r > 0 only the adapters (and value/reward heads) train")
    lora_alpha: float = field(32.0, "LoRA scale numerator: the update is (lora_alpha / lora_r) B A x")
    lora_dropout: float = field(0.0, "dropout on the LoRA input (0 keeps the sampler's and learner's forward identical)")
    lora_target_modules: list[str] = field(["all-linear"], "linear layers that get adapters (all-linear: every one but the LM head)")
    merge_lora: bool = field(False, "final/ holds the merged HF model (the adapter in final/adapter/) instead of the adapter")
    load_in_4bit: bool = field(False, "QLoRA: load the base in 4-bit NF4 (CUDA + bitsandbytes; needs lora_r > 0)")

    def __post_init__(self) -> None:
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise ConfigError(f"'device' must be auto, cpu, cuda or cuda:N, got {self.device!r}.")
        check_at_least(self, ("lora_r",), 0)
        check_at_least(self, ("logprob_chunk_mb",), 0, inclusive=False)
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"'lora_dropout' must be in [0, 1), got {self.lora_dropout}.")
        if not self.lora_target_modules:
            raise ConfigError("'lora_target_modules' is empty. Fix: lora_target_modules=[all-linear] or name layers, "
                              "e.g. [q_proj,v_proj].")
        if self.merge_lora and not self.lora_r:
            raise ConfigError("merge_lora=true needs LoRA (lora_r > 0).")
        super().__post_init__()


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclasses.dataclass
class OptimSection(Section):
    title = "optimizer and schedule"
    lr: float = field(1e-3, "peak learning rate (AdamW)")
    weight_decay: float = field(0.0, "AdamW weight decay")
    adam_betas: list[float] = field([0.9, 0.99], "AdamW betas")
    lr_schedule: Literal["cosine", "linear", "constant"] = field("cosine", "decay after warmup")
    warmup_steps: int = field(10, "linear warmup steps from 0 to lr")
    min_lr_ratio: float = field(0.1, "final lr as a fraction of lr (cosine/linear)")
    max_steps: int = field(200, "optimizer steps to train")
    max_grad_norm: float | None = field(1.0, "clip the global gradient norm (null: no clipping)")
    grad_accum: int = field(1, "micro-batches per optimizer step; the batch is split evenly")

    def __post_init__(self) -> None:
        check_at_least(self, ("lr", "max_steps", "grad_accum"), 0, inclusive=False)
        check_at_least(self, ("warmup_steps",), 0)
        if len(self.adam_betas) != 2:
            raise ConfigError(f"'adam_betas' must be two numbers, got {self.adam_betas}.")
        super().__post_init__()


TRACKERS = ("tensorboard", "wandb", "trackio")


@dataclasses.dataclass
class RunSection(Section):
    title = "run directory, logging and checkpoints"
    output_dir: str = field("runs/default", "run directory: config.yaml, metrics.jsonl, samples.jsonl, checkpoints/, plots/")
    resume: bool = field(False, "continue from the newest checkpoint in output_dir")
    overwrite: bool = field(False, "allow starting a fresh run in a non-empty output_dir")
    log_every: int = field(10, "log metrics every N steps (and always at the first and last step)")
    eval_every: int = field(100, "evaluate every N steps (0: only at the start and end)")
    save_every: int = field(100, "save a checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = field(2, "how many step-N checkpoints to keep")
    keep_best: str | None = field(None, "also keep best/: the model (HF format) at the evaluation with the best value of this metric, e.g. eval/accuracy (null: off)")
    keep_best_mode: Literal["auto", "max", "min"] = field("auto", "keep_best: higher is better, or with auto lower for a metric named loss* or *ce (eval/loss, eval/ptx_ce)")
    num_samples: int = field(4, "completions written to samples.jsonl at each evaluation")
    report_to: list[str] = field([], "extra trackers: tensorboard, wandb, trackio (when installed)")

    def __post_init__(self) -> None:
        check_output_dir(self.output_dir)
        check_at_least(self, ("log_every", "keep_checkpoints"), 0, inclusive=False)
        check_at_least(self, ("eval_every", "save_every", "num_samples"), 0)
        for name in self.report_to:
            if name not in TRACKERS:
                raise ConfigError(f"'report_to' entry '{name}' is unknown.{suggest(name, TRACKERS)} Known: {list(TRACKERS)}.")
        super().__post_init__()


@dataclasses.dataclass
class EvalSection(Section):
    title = "evaluation metrics (lmrl eval's, inside training)"
    eval_metrics: list[str] = field([], "metrics of `lmrl eval` computed at every evaluation and logged as evals/<name>: "
                                        "accuracy, pass@K, pass^K, maj@K, avg@K, reward, win_rate, loglik")
    eval_metrics_dataset: str | None = field(None, "their rows (default: the task dataset's test split, or eval_dataset)")
    eval_metrics_rows: int = field(100, "rows evaluated by eval_metrics")
    eval_metrics_args: dict = field({}, "options as in `lmrl eval`: samples, temperature, max_new_tokens, verifier, "
                                        "reward_model, judge, baseline, ...")
    check_contamination: bool = field(True, "at start-up, warn when eval rows share 8-grams with the training data")

    def __post_init__(self) -> None:
        check_at_least(self, ("eval_metrics_rows",), 1)
        from lmrl.eval.spec import parse_metrics  # pure, imports nothing of lmrl

        try:
            _ = self.eval_metrics and parse_metrics(self.eval_metrics, "eval_metrics")
        except ValueError as err:
            raise ConfigError(str(err)) from None
        super().__post_init__()


@dataclasses.dataclass
class TrainConfig(ParallelSection, EvalSection, RunSection, OptimSection, ModelSection):
    """Fields every verb shares (model, optimizer, run directory); method configs add sections and their own keys."""


@dataclasses.dataclass
class DecodingSection(Section):
    title = "sampling"
    temperature: float = field(1.0, "sampling temperature")
    top_p: float = field(1.0, "nucleus sampling")
    top_k: int = field(0, "top-k sampling (0: off)")
    sampling_shards: int = field(0, "a step's batch is sampled in this many shards (whole prompt groups), each with its own seeded generator (0: one per process); fixed, it makes the samples independent of the number of processes")

    def __post_init__(self) -> None:
        check_at_least(self, ("temperature",), 0, inclusive=False)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"'top_p' must be in (0, 1], got {self.top_p}.")
        check_at_least(self, ("top_k", "sampling_shards"), 0)
        super().__post_init__()


@dataclasses.dataclass
class SamplingSection(DecodingSection):
    """Sampling of G completions per prompt (``temperature``, ``top_p``, ``top_k`` from `DecodingSection`)."""

    title = "sampling"
    samples_per_prompt: int = field(8, "completions per prompt (G); a step trains on prompts x G completions")
    max_new_tokens: int = field(32, "completion length cap in tokens")

    def __post_init__(self) -> None:
        check_at_least(self, ("samples_per_prompt", "max_new_tokens"), 1)
        super().__post_init__()


@dataclasses.dataclass
class RewardSection(Section):
    title = "rewards"
    rewards: list[str] = field(["task"], "reward functions: registry names, model:PATH (a reward model), http(s)://HOST/PATH (a reward server) or module:function")
    reward_weights: list[float] = field([], "one weight per reward (default 1.0 each)")
    reward_kwargs: dict = field({}, "options per reward name, e.g. {overlong: {max_len: 32, cache_len: 8}}")
    on_reward_error: Literal["skip", "stop"] = field("skip", "a failing reward function skips the step or stops the run")
    max_skipped_steps: int = field(10, "on_reward_error=skip: this many failing steps in a row stop the run (exit 1)")
    reward_workers: int = field(1, "threads that call the reward functions concurrently, each once per batch (1: one after the other)")
    reward_normalize: bool = field(False, "standardise each reward function over the batch, (r - mean) / (std + 1e-6), before the weighted sum")
    def __post_init__(self) -> None:  # (no blank line above: this module is at the 450-line cap)
        check_at_least(self, ("max_skipped_steps", "reward_workers"), 1)
        if self.reward_weights and len(self.reward_weights) != len(self.rewards):
            raise ConfigError(f"reward_weights has {len(self.reward_weights)} entries for {len(self.rewards)} rewards {self.rewards}: give one weight per reward, or none (1.0 each).")
        super().__post_init__()
