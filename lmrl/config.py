"""Typed configs: dataclasses, YAML recipes, ``key=value`` overrides, validation.

Every config field is a YAML key and a command-line override::

    lmrl sft --config sft/tiny_arithmetic lr=3e-4 task_args.digits=3

Unknown keys, wrong types and bad choices fail at start-up with a message that
names the key and the fix (with the closest valid name for typos).

The shared sections that configs compose (model, optimizer, run, evaluation, sampling, rewards, data) are
declared in `lmrl.config_sections` and re-exported here.
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

from lmrl.config_base import (  # noqa: F401 - the building blocks, re-exported
    ConfigError,
    Section,
    check_at_least,
    check_output_dir,
    expand_home,
    field,
    finite,
    section_view,
    suggest,
)
from lmrl.config_sections import (  # noqa: F401 - the shared sections, re-exported: configs import them from here
    DEVICE_PATTERN,
    TRACKERS,
    ChatSection,
    DataSection,
    DecodingSection,
    EvalSection,
    ModelSection,
    OptimSection,
    RewardSection,
    RowsSection,
    RunSection,
    SamplingSection,
    TaskSection,
    TrainConfig,
)
from lmrl.config_trl import (  # noqa: F401 - re-exported: TRL's names
    ALIAS_CONFIGS,
    ALIAS_VALUES,
    ALIASES,
    AS_LMRL_DOES,
    NO_EQUIVALENT,
    REFUSED,
    TRL_BOOLS,
    alias_value,
)

RECIPES_DIR = Path(__file__).parent / "recipes"


class _Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false. (YAML 1.1 reads off/on/yes/no as booleans: ``dynamic_sampling=off``.)"""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


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


def applies(alias: str, cls: type, fields: typing.Collection[str]) -> bool:
    """Whether TRL's ``alias`` is read as its lmrl key in ``cls``: the key is there, the name itself is not."""
    return (
        ALIASES[alias] in fields and alias not in fields and cls.__name__ in ALIAS_CONFIGS.get(alias, (cls.__name__,))
    )


def resolve_aliases(cls: type, data: dict[str, Any], notify: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Rename the TRL/HF aliases in ``data`` to ``cls``'s keys, with a one-line notice each; drop the TRL settings
    set to what lmrl does anyway (``packing=false``), with a notice too."""
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    out = dict(data)
    for alias, name in ALIASES.items():
        if alias not in out or not applies(alias, cls, fields):
            continue
        if name in out:
            raise ConfigError(f"Both '{alias}' (TRL's name) and '{name}' are set; keep one ('{name}').")
        out[name] = alias_value(alias, out.pop(alias))
        (notify or _notice)(f"note: '{alias}' is read as lmrl's '{name}' ({name}={out[name]})")
    for name, value in AS_LMRL_DOES.items():
        if name in out and name not in fields and out[name] is value:
            out.pop(name)
            (notify or _notice)(f"note: '{name}={str(value).lower()}' is what lmrl does anyway (ignored)")
    return out


def _notice(text: str) -> None:
    print(text, file=sys.stderr)


def unknown_key_message(key: str, cls: type) -> str:
    """'Unknown config key ...' with lmrl's equivalent of a TRL name, or the closest key or alias for a typo (an alias
    suggests the key it stands for). A TRL name is never answered with a look-alike key of another meaning."""
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    tail = "Run with --help-config to list every key."
    if key in REFUSED:
        return f"'{key}' (TRL/transformers) is not an lmrl key: {REFUSED[key]}."
    if key in ALIASES:
        return f"'{key}' is TRL's name for lmrl's '{ALIASES[key]}', which {cls.__name__} does not have. {tail}"
    if key in NO_EQUIVALENT:
        return f"'{key}' is a TRL/transformers setting that lmrl has no equivalent of ({cls.__name__}). {tail}"
    names = fields + [a for a in ALIASES if applies(a, cls, fields)]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = ""
    if close:
        target = close[0] if close[0] in fields else ALIASES[close[0]]
        hint = f" Did you mean '{target}'?" + (f" ('{close[0]}' in TRL)" if target != close[0] else "")
    return f"Unknown config key '{key}' for {cls.__name__}.{hint} {tail}"


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
        if (
            issubclass(base, Section)
            and base.__dict__.get("title")
            and name in base.__dict__.get("__annotations__", {})
        ):
            return base.title
    return ""


def describe(cls: type) -> str:
    """The keys grouped by section, one line each: name, type, default and the field's help."""
    hints = typing.get_type_hints(cls)
    groups: dict[str, list[str]] = {}
    for f in dataclasses.fields(cls):
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
        )
        line = f"  {f.name} ({_type_name(hints[f.name])}, default {default!r}): {f.metadata.get('help', '')}"
        groups.setdefault(section_of(cls, f.name), []).append(line)
    own = groups.pop("", [])
    parts = [f"{cls.__name__.removesuffix('Config') or cls.__name__}:\n" + "\n".join(own)] if own else []
    parts += [f"{title}:\n" + "\n".join(lines) for title, lines in groups.items()]
    aliases = [f"{a} -> {n}" for a, n in ALIASES.items() if applies(a, cls, hints)]
    if aliases:
        parts.append("TRL/HF names accepted: " + ", ".join(aliases))
    return "\n\n".join(parts)
