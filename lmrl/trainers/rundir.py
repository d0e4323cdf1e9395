"""What lmrl owns in a run directory, and what a resume may change.

- ``config.yaml`` starts with `CONFIG_HEADER`; a ``config.yaml`` without it (a user's recipe, as in
  ``lmrl sft --config exp/config.yaml output_dir=exp``) is never overwritten.
- A directory holds a *run* once it has a checkpoint or a logged step >= 1: a start that failed at the step-0
  evaluation or the first step leaves no run, so the corrected command starts afresh without ``overwrite=true``.
- ``run.json`` records what ``precision=auto`` resolved to (`lmrl.models.precision.recorded_precision`), so a
  resume computes in the same dtype.
- Resuming with changed keys: ``lr`` is applied to the restored optimizer and scheduler; keys whose value lives in
  the checkpoint (`FIXED_ON_RESUME`) are refused, naming the difference; every other key is read afresh each step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from lmrl.config import ConfigError
from lmrl.models.precision import RUN_FILE

CONFIG_HEADER = "# Written by lmrl: the resolved config of this run (lmrl rewrites this file; edit a copy).\n"
FIXED_ON_RESUME = ("seed", "weight_decay", "adam_betas", "adam_eps")
"""Restored from the checkpoint (RNG states, optimizer parameter groups): a resume cannot change them."""
NOT_COMPARED = ("resume", "overwrite", "output_dir")


def logged_steps(path: Path) -> list[int]:
    """Steps of the complete JSON lines of a metrics.jsonl (a cut or garbled line is ignored)."""
    steps = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                steps.append(int(json.loads(line).get("step", 0)))
            except (ValueError, TypeError, AttributeError):
                continue
    return steps


def has_run(run_dir: Path) -> bool:
    """True once ``run_dir`` holds a checkpoint or a logged training step (>= 1)."""
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        return True
    return any(step >= 1 for step in logged_steps(run_dir / "metrics.jsonl"))


def own_config(run_dir: Path) -> bool:
    """Whether ``run_dir/config.yaml`` was written by lmrl (starts with `CONFIG_HEADER`)."""
    try:
        with (run_dir / "config.yaml").open("rb") as f:
            return f.readline() == CONFIG_HEADER.encode()
    except OSError:
        return False


def foreign_config(run_dir: Path) -> Path | None:
    """``run_dir/config.yaml`` if it exists and lmrl did not write it (runs from before the header count as
    lmrl's when they hold a run)."""
    path = run_dir / "config.yaml"
    if not path.exists() or own_config(run_dir) or has_run(run_dir):
        return None
    return path


def check_writable(run_dir: Path) -> None:
    """Refuse a ``config.yaml`` lmrl did not write; create ``run_dir`` with a clear error if that fails."""
    path = foreign_config(run_dir)
    if path is not None:
        raise FileExistsError(
            f"'{path}' was not written by lmrl (your recipe?) and lmrl never overwrites it. "
            f"Choose another output_dir=..., or move the file."
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"'output_dir' {str(run_dir)!r} cannot be created: {exc.strerror}. Choose a writable output_dir=..."
        ) from None


def write_config(
    run_dir: Path, config_dict: dict[str, Any], precision: str | None = None, method: str | None = None
) -> None:
    """``config.yaml`` (with `CONFIG_HEADER`) and, when known, the resolved precision and the run's method
    (`method_name`) in ``run.json``."""
    check_writable(run_dir)
    (run_dir / "config.yaml").write_text(CONFIG_HEADER + yaml.safe_dump(config_dict, sort_keys=False))
    record = {k: v for k, v in (("precision", precision), ("method", method)) if v}
    if record:
        (run_dir / RUN_FILE).write_text(json.dumps({**read_run_file(run_dir), **record}) + "\n")


def read_run_file(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


METHOD_KEYS = ("mode", "algorithm", "objective", "variant", "online")
"""Keys that pick the method within a verb (``lmrl rl algorithm=ppo``, ``lmrl dpo online=true``): part of
`method_name`."""


def method_name(config_class: str, config_dict: dict[str, Any]) -> str:
    """The verb and method a run trains, e.g. ``rl algorithm=grpo`` (from ``RLConfig``) or ``sft``."""
    verb = config_class.removesuffix("Config").lower()
    return " ".join([verb, *(f"{k}={config_dict[k]}".lower() for k in METHOD_KEYS if k in config_dict)])


def check_method(run_dir: Path, method: str) -> None:
    """Refuse to resume the run in ``run_dir`` with another verb or method than the one ``run.json`` records (a
    GRPO run continued from an SFT run's checkpoint would start from its weights and optimizer as if it were its
    own). Runs from before the method was recorded are not checked."""
    recorded = read_run_file(run_dir).get("method")
    if recorded and recorded != method:
        raise ConfigError(
            f"resume=true: output_dir '{run_dir}' holds a run of `lmrl {recorded}`, and this is `lmrl {method}`. A "
            f"resume continues a run with its own method. Choose another output_dir=... (to start from that run's "
            f"weights: model={run_dir / 'final'}, or one of its checkpoints), or overwrite=true to replace it."
        )


def saved_config(checkpoint: Path, state: dict[str, Any]) -> dict[str, Any] | None:
    """The config a checkpoint was trained with: stored in it, or (older checkpoints) the run's config.yaml."""
    if isinstance(state.get("config"), dict):
        return state["config"]
    path = checkpoint.parent.parent / "config.yaml"
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return loaded if isinstance(loaded, dict) else None


def resume_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (checkpoint's value, new value)}`` for the keys a resume changes; raises ConfigError for
    `FIXED_ON_RESUME` keys."""
    if old is None:
        return {}
    changes = {k: (old[k], v) for k, v in new.items() if k in old and k not in NOT_COMPARED and old[k] != v}
    fixed = {k: change for k, change in changes.items() if k in FIXED_ON_RESUME}
    if fixed:
        diff = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in fixed.items())
        raise ConfigError(
            f"resume=true cannot change {diff}: the checkpoint's RNG and optimizer state hold them. "
            f"Resume with the run's values, or start a new run (another output_dir=...)."
        )
    return changes


def apply_lr(optimizer, scheduler, old_lr: float, new_lr: float) -> None:
    """Rescale the restored optimizer's and scheduler's learning rates by ``new_lr / old_lr`` (every parameter
    group keeps its ratio to the peak lr; the schedule continues from the restored step)."""
    ratio = new_lr / old_lr
    for group in optimizer.param_groups:
        group["lr"] *= ratio
        if "initial_lr" in group:
            group["initial_lr"] *= ratio
    if hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * ratio for lr in scheduler.base_lrs]
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
