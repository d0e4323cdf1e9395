"""Which checkpoint a resume can load: the newest one whose files are whole.

A checkpoint is renamed into place only once written (`lmrl.trainers.common.save_checkpoint`), but a disk can
still lose its tail later (a full disk on another writer, a copy cut short, a bad sector). A resume checks, cheaply
and without loading the weights, that every file of the newest checkpoint is whole: ``trainer_state.pt`` opens as
a zip archive (its directory is at the end, so a cut file fails), each ``*.safetensors`` file is as long as its
header says, and a multi-process checkpoint's DCP files are as long as their metadata says. A damaged checkpoint is
moved aside to ``checkpoints/damaged-step-N`` (kept for inspection, out of the resume order and of pruning), with a
notice naming it, and the next newest is tried; when none is whole the resume stops with an error and moves nothing.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path

import torch


def problem(checkpoint: Path, state_file: str) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (a file cut short or unreadable), or None when it is whole."""
    try:
        torch.load(checkpoint / state_file, weights_only=True, mmap=True, map_location="cpu")
    except pickle.UnpicklingError:
        return None  # whole, but pickled objects: `common.safe_load` refuses it with its own message
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        return f"{state_file} is cut or unreadable ({str(exc).splitlines()[0][:120]})"
    for path in sorted(checkpoint.glob("*.safetensors")):
        why = _safetensors_problem(path)
        if why:
            return why
    if (checkpoint / "dcp").is_dir():
        return _dcp_problem(checkpoint / "dcp")
    return None


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > size - 8:
                return f"{path.name} is cut ({size} bytes, shorter than its header)"
            header = json.loads(f.read(length))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"{path.name} is unreadable ({exc})"
    if size != 8 + length + end:
        return f"{path.name} is cut ({size} of {8 + length + end} bytes)"
    return None


def _dcp_problem(dcp_dir: Path) -> str | None:
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(dcp_dir)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any failure to read the metadata makes the checkpoint unusable
        return (
            f"dcp/.metadata is cut or unreadable ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})"
        )
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, length in sorted(needed.items()):
        size = (dcp_dir / name).stat().st_size if (dcp_dir / name).is_file() else 0
        if size < length:
            return f"dcp/{name} is cut ({size} of {length} bytes)"
    return None


def newest_intact(checkpoints: list[Path], state_file: str, notice: Callable[[str], None]) -> Path | None:
    """The newest whole checkpoint of ``checkpoints`` (oldest first); the damaged newer ones are moved aside with a
    notice. None when there are no checkpoints; a `ValueError` when there are and none is whole."""
    damaged = []
    for checkpoint in reversed(checkpoints):
        why = problem(checkpoint, state_file)
        if why is None:
            for bad, reason in damaged:
                aside = bad.with_name(f"damaged-{bad.name}")
                n = 1
                while aside.exists():
                    n += 1
                    aside = bad.with_name(f"damaged-{bad.name}.{n}")
                bad.rename(aside)
                notice(
                    f"resume: checkpoint {bad.name} is damaged: {reason}. Moved to {aside}; resuming from "
                    f"{checkpoint.name} instead."
                )
            return checkpoint
        damaged.append((checkpoint, why))
    if damaged:
        listed = "; ".join(f"{bad.name}: {reason}" for bad, reason in damaged)
        raise ValueError(
            f"resume=true: no checkpoint in {damaged[0][0].parent} is whole ({listed}). Nothing was "
            f"changed. Start a new run (overwrite=true, or another output_dir=...), or delete the damaged "
            f"checkpoints to start this one again from step 0."
        )
    return None
