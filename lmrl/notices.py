"""One-line notices: a speed-up switched off for a model, naming the speed-up, the model and why.

The speed-ups (fused layers, packed bf16 linears, the chunked LM head) each check at start-up that they reproduce
the model's own computation up to rounding (`lmrl.numerics`), and a model that fails keeps its own, slower path.
That must never be silent: `switched_off` warns once per speed-up, model and reason with `SpeedupOff`, which the CLI
prints as one line, and each speed-up's metric (docs/metrics.md: `update/fused_calls`, `update/chunked_head`,
`rollout/packed_linear_calls`) counts what really ran.
"""

from __future__ import annotations

import os
import warnings

__all__ = ["SpeedupOff", "model_name", "print_as_one_line", "switched_off"]


class SpeedupOff(UserWarning):
    """A speed-up lmrl switched off for a model, and why."""


def switched_off(speedup: str, model: str, why: str) -> None:
    """Warn (once per message) that ``speedup`` is off for ``model`` because ``why``."""
    warnings.warn(f"{speedup} is off for {model}: {why}", SpeedupOff, stacklevel=3)


def print_as_one_line(print_line) -> None:
    """Show every `SpeedupOff` warning, and every warning lmrl's own code raises, as one line through ``print_line``
    (the CLI's console); others as before."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, SpeedupOff):
            print_line(f"Speed-up off: {message}")
        elif f"{os.sep}lmrl{os.sep}" in str(filename):
            print_line(f"Warning: {message}")
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def model_name(model) -> str:
    """``model``'s class and, where its config has one, the path or hub id it was loaded from."""
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return f"{type(model).__name__} ('{path}')" if path else type(model).__name__
