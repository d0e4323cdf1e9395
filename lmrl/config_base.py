"""The building blocks of every config: the error type, fields with help strings, and sections.

`lmrl.config` builds the shared sections from these and re-exports them; configs elsewhere (tools, engines) that
only need the blocks import them from here.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any


class ConfigError(ValueError):
    """A config problem found at start-up, with a message that says how to fix it."""


def field(default: Any, help: str) -> Any:  # noqa: A002 - mirrors argparse's name
    """A dataclass field with a one-line help string (shown by ``--help-config``)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


class Section:
    """A group of config keys declared once and shared by every config that composes it.

    Configs are flat (every key is a top-level YAML key and override) and composed by inheritance:
    ``class RLConfig(SamplingSection, RewardSection, TrainConfig)``. ``title`` names the group in
    ``--help-config``; each section's ``__post_init__`` checks its own keys and calls the next one's.
    """

    title = ""

    def __post_init__(self) -> None:
        pass


def check_at_least(config: Any, names: typing.Iterable[str], minimum: float, inclusive: bool = True) -> None:
    for name in names:
        value = getattr(config, name)
        if value < minimum or (not inclusive and value == minimum):
            raise ConfigError(f"'{name}' must be {'>=' if inclusive else '>'} {minimum:g}, got {value}.")
