"""The building blocks of every config: the error type, fields with help strings, and sections.

`lmrl.config_sections` builds the shared sections from these (`lmrl.config` re-exports them); configs elsewhere
(tools, engines) that only need the blocks import them from here.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config problem found at start-up, with a message that says how to fix it."""


def field(default: Any, help: str) -> Any:  # noqa: A002 - mirrors argparse's name
    """A dataclass field with a one-line help string (shown by ``--help-config``)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def suggest(name: str, choices: typing.Iterable[str]) -> str:
    """' Did you mean X?' for the closest choice, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


class Section:
    """A group of config keys declared once and shared by every config that composes it.

    Flat outside, typed inside. Configs are flat (every key is a top-level YAML key and override, and an
    attribute) and composed by inheritance: ``class RLConfig(SamplingSection, RewardSection, TrainConfig)``. Each
    section also gives the configs that compose it a typed view of its keys (``config.sampling`` is a
    `SamplingSection` holding exactly the sampling keys, `section_view`), so a consumer takes the section it needs
    and its type guarantees the keys. ``title`` names the group in ``--help-config``; each section's
    ``__post_init__`` checks its own keys and calls the next one's; the last one checks the rules between
    sections (`lmrl.config_rules`).
    """

    title = ""

    def __post_init__(self) -> None:
        check_counts(self)
        for f in dataclasses.fields(self):  # configs built in Python (no `coerce`): the same two rules
            value = getattr(self, f.name)
            items = value if isinstance(value, list) else [value]
            checked = [expand_home(f.name, finite(f.name, v)) for v in items]
            setattr(self, f.name, checked if isinstance(value, list) else checked[0])
        from lmrl.config_rules import broken_rule

        message = broken_rule(self)
        if message:
            raise ConfigError(message)


S = typing.TypeVar("S", bound=Section)


def section_view(config: Section, cls: type[S]) -> S:
    """``cls``'s keys of ``config`` as a ``cls``: exactly that section's keys, with the section's properties and
    methods. Built without checks (``config`` passed them) and afresh at each call (a config is not changed after it
    is built)."""
    view = object.__new__(cls)
    for f in dataclasses.fields(cls):
        object.__setattr__(view, f.name, getattr(config, f.name))
    return view


COUNT_SUFFIXES = ("batch_size", "_per_step", "_per_prompt")
COUNT_KEYS = ("train_rows",)
"""Integer keys ending in `COUNT_SUFFIXES`, or named in `COUNT_KEYS`, are counts of examples, prompts or samples: 0
would fail only after the model loaded (an empty batch), so `Section` refuses it at start-up for every config."""


def check_counts(config: Any) -> None:
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        is_count = f.name.endswith(COUNT_SUFFIXES) or f.name in COUNT_KEYS
        if is_count and isinstance(value, int) and not isinstance(value, bool) and value < 1:
            every = " (or null: every row)" if f.name.endswith("_rows") else ""
            raise ConfigError(f"'{f.name}' must be >= 1{every}, got {value}.")


def finite(key: str, value: Any) -> Any:
    """``value``, refused when it is a NaN or infinite float: every float key of every config goes through here
    (`lmrl.config.coerce` at load, `Section` for configs built in Python), so ``kl_coef=nan`` cannot train with no
    KL, nor ``lr=inf`` fail later with a message that names no key."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"'{key}' must be a finite number, got {value}.")
    return value


TEXT_KEY_SUFFIXES = ("prompt", "prompts", "stop", "template")
"""String keys that hold text rather than paths: a leading ``~`` in them is kept."""


def expand_home(key: str, value: Any) -> Any:
    """A string config value that starts with ``~/`` (or is ``~``) is a path under the home directory: expanded, so
    ``output_dir=~/runs/x`` writes to ``$HOME/runs/x`` and not to a folder named ``~`` (keys of text excepted)."""
    name = key.split("[")[0].split(".")[-1]
    if isinstance(value, str) and (value == "~" or value.startswith("~/")) and not name.endswith(TEXT_KEY_SUFFIXES):
        return os.path.expanduser(value)
    return value


def check_at_least(config: Any, names: typing.Iterable[str], minimum: float, inclusive: bool = True) -> None:
    for name in names:
        value = getattr(config, name)
        if value < minimum or (not inclusive and value == minimum):
            raise ConfigError(f"'{name}' must be {'>=' if inclusive else '>'} {minimum:g}, got {value}.")


def check_output_dir(output_dir: str, key: str = "output_dir") -> None:
    """``output_dir`` (or another directory key) must be (or be creatable as) a directory: checked before any
    model loads."""
    path = Path(output_dir).expanduser()
    for existing in (path, *path.parents):
        if existing.exists():
            if not existing.is_dir():
                what = "is a file" if existing == path else f"is under the file '{existing}'"
                raise ConfigError(f"'{key}' {output_dir!r} {what}. Choose a directory: {key}=...")
            if existing != path and not os.access(existing, os.W_OK | os.X_OK):
                raise ConfigError(
                    f"'{key}' {output_dir!r} cannot be created: '{existing}' is not writable. "
                    f"Choose a writable {key}=..."
                )
            return


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def pickled_weights_message(config: Any) -> str:
    """One line for weights that would only load by unpickling code (issue 46: a 38-51 line traceback): the model
    folders of `config` that hold pickles and no safetensors, and the fix."""
    folders = []
    for key, value in sorted(vars(config).items()) if config is not None else ():
        if isinstance(value, str) and key.endswith("model") and os.path.isdir(os.path.expanduser(value)):
            names = os.listdir(os.path.expanduser(value))
            pickles = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
            if pickles and not any(n.endswith(".safetensors") for n in names):
                folders.append(f"'{key}' {value!r} holds only pickled weights ({', '.join(pickles[:3])})")
    where = "; ".join(folders) or "a weights file is a pickle that holds more than tensors"
    return (
        f"{where}, which lmrl loads only as plain tensors (weights_only=True: unpickling can run code), and this one "
        "is not. Convert it to safetensors where you trust it (model.save_pretrained(DIR, "
        "safe_serialization=True)), or use a folder with *.safetensors."
    )


def check_input_file(key: str, value: str) -> None:
    """A key naming a file to read (``prompts_file``): it exists and is a regular file, not a folder or a FIFO."""
    path = Path(value).expanduser()
    if not path.exists():
        raise ConfigError(f"'{key}' {value!r} does not exist (working directory {os.getcwd()}).")
    if path.is_dir():
        raise ConfigError(f"'{key}' {value!r} is a directory; give a file: {key}=PATH.")
    if not path.is_file():
        raise ConfigError(
            f"'{key}' {value!r} is not a regular file (a FIFO or a device would block or never end); "
            f"give a file: {key}=PATH."
        )
