"""Checkpoints of a multi-process run through torch.distributed.checkpoint (DCP), and the consolidated ``final/``.

``checkpoints/step-N/`` holds ``dcp/`` (every rank writes its shards of the weights and optimizer state; loads onto
any world size), ``trainer_state.pt`` (step, scheduler, the method's state; rank 0) and ``rng-rank{R}.pt`` (each
rank's RNG). It is written to ``.tmp-step-N`` and renamed by rank 0 after every rank finished, so a rank killed
mid-save leaves the previous checkpoint the newest complete one. ``final/`` is a plain HF directory
(``save_pretrained`` of the full state dict gathered on rank 0).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from lmrl.models.loading import save_model
from lmrl.models.lora import is_peft, save_adapter
from lmrl.parallel import runtime
from lmrl.trainers import common
from lmrl.trainers.common import STATE_FILE, Run, list_checkpoints, read_state, rng_state, safe_load, set_rng_state


def write_failure(exc: BaseException, directory: Path | None = None) -> BaseException | None:
    """The failed write behind a checkpoint error, or None: DCP gathers every rank's exception into a
    `CheckpointException` (a BaseException, which `lmrl.cli` would print as a traceback). Decided by errno and
    the free space in `directory` (`common.write_failure`)."""
    if isinstance(exc, CheckpointException):
        causes = [f[0] if isinstance(f, tuple) else f for f in exc.failures.values()]
        found = (common.write_failure(c, directory) for c in causes if isinstance(c, BaseException))
        return next((c for c in found if c is not None), None)
    return common.write_failure(exc, directory)


def rng_file(rank: int) -> str:
    return f"rng-rank{rank}.pt"


def save_checkpoint(
    run: Run, step: int, model, tokenizer, optimizer, scheduler, state: dict[str, Any] | None = None, keep: int = 2
) -> Path:
    """Every rank: its DCP shards and RNG; rank 0: the trainer state, the tokenizer, then the atomic rename."""
    final = run.checkpoints_dir / f"step-{step}"
    tmp = run.checkpoints_dir / f".tmp-step-{step}"
    if runtime.is_main():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    runtime.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    try:  # a full disk: every rank that fails says so in one paragraph (torchrun stops the others)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp / "dcp"))
        torch.save(rng_state(), tmp / rng_file(runtime.rank()))
        runtime.barrier()
        if runtime.is_main():
            tokenizer.save_pretrained(tmp)
            torch.save({"step": step, "scheduler": scheduler.state_dict(), "trainer": state or {}}, tmp / STATE_FILE)
    except (OSError, RuntimeError, CheckpointException) as exc:
        cause = write_failure(exc, tmp)
        if cause is None:
            raise
        if runtime.is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        raise common.checkpoint_failed(run, step, cause) from None
    if runtime.is_main():
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in list_checkpoints(run.dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    runtime.barrier()
    return final


def restore_checkpoint(checkpoint: Path, model, optimizer, scheduler) -> dict[str, Any]:
    """Load weights and optimizer state (DCP, resharded to this world size), scheduler and this rank's RNG."""
    if not (checkpoint / "dcp").is_dir():
        raise FileNotFoundError(
            f"{checkpoint} is a single-process checkpoint (no dcp/); resume it with nproc=1, or "
            f"start a fresh multi-process run from its weights with model={checkpoint}."
        )
    model_state, optim_state = get_state_dict(model, optimizer)
    states = {"model": model_state, "optim": optim_state}
    dcp.load(states, checkpoint_id=str(checkpoint / "dcp"))
    set_state_dict(model, optimizer, model_state_dict=states["model"], optim_state_dict=states["optim"])
    state = read_state(checkpoint, ("step", "scheduler", "trainer"))
    scheduler.load_state_dict(state["scheduler"])
    rng = checkpoint / rng_file(runtime.rank())
    if rng.exists():  # a resume on another world size: the new ranks keep their seeded RNG
        set_rng_state(safe_load(rng))
    return state["trainer"]


def save_final(run: Run, model, tokenizer, merge_lora: bool = False, name: str = "final") -> Path:
    """``final/`` (or ``name``): FSDP: the full weights gathered to rank 0 and saved as one HF directory; DDP: rank 0
    saves its full replica as one process would (LoRA: the adapter, or merged with ``merge_lora``)."""
    from torch.distributed.fsdp import FSDPModule

    path = run.dir / name
    if not any(isinstance(m, FSDPModule) for m in model.modules()):
        if runtime.is_main() and merge_lora and is_peft(model):
            # a DDP replica cannot be deep-copied (merged_copy): merge in place, the run's training is over
            save_adapter(model, tokenizer, path / "adapter", merge=False)
            save_model(model.merge_and_unload(), tokenizer, path)
        elif runtime.is_main():
            common.save_final(run, model, tokenizer, name=name)
        runtime.barrier()
        return path
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if runtime.is_main():
        save_model(model, tokenizer, path, state_dict=full)
    runtime.barrier()
    return path
