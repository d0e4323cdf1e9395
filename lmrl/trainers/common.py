"""Pieces every trainer shares, as functions: run directory, seeding, optimizer and
schedule, the policy ready to train, the optimizer step, and exact checkpoint/resume.

A checkpoint ``checkpoints/step-N/`` holds HF ``save_pretrained`` weights and
tokenizer plus ``trainer_state.pt`` (optimizer, scheduler, RNG states and the
trainer's own state such as the data position), so ``resume=true`` continues a
killed run to the same final metrics as an uninterrupted one.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.markup import escape

from lmrl.config import TrainConfig, to_dict
from lmrl.data import packing
from lmrl.eval.training import build_evaluator, contamination, warning_text
from lmrl.models.loading import save_model
from lmrl.models.lora import TRAINABLE_FILE, has_frozen_weights, is_peft, load_trainable, save_adapter, save_trainable
from lmrl.models.precision import RUN_FILE, precision_of
from lmrl.parallel import runtime
from lmrl.tracking import Tracker, console
from lmrl.trainers import ckpt_world, intact, rundir, runlock
from lmrl.trainers.writes import is_write_failure, write_failure  # noqa: F401 - re-exported

STATE_FILE = ckpt_world.STATE_FILE  # the file every complete checkpoint has


class TrainingStopped(RuntimeError):
    """The run cannot usefully continue (the CLI exits with status 1); the last good checkpoint is left intact."""


class TrainingDiverged(TrainingStopped):
    """Loss or gradient became NaN/inf, or one update blew up the weights; the last good checkpoint is intact."""


MAX_WEIGHT_GROWTH = 2.0
"""One optimizer step that multiplies the norm of the trained weights by more than this is divergence (an lr of
1e6 turns weights of ~1e-2 into ~1e6 with finite values); sane steps change it by well under 1%."""


# --------------------------------------------------------------------------- run directory


@dataclass
class Run:
    """An open run: its directory, tracker and the step to start from."""

    dir: Path
    tracker: Tracker
    start_step: int
    checkpoint: Path | None  # the checkpoint to resume from, if any
    evaluator: Any = None  # `lmrl.eval.runner.Evaluator` of config.eval_metrics, or None
    method: str = ""  # `rundir.method_name` of the run's config, recorded in run.json

    @property
    def checkpoints_dir(self) -> Path:
        return self.dir / "checkpoints"


def start_run(config: TrainConfig, description: str) -> Run:
    """Prepare ``output_dir`` (fresh, overwritten or resumed), seed, open the tracker. ``config.yaml`` is written
    by `write_run_config` once the checkpoint has loaded (`lmrl.trainers.rundir` says what lmrl owns there).

    Before touching the directory: the ``eval_metrics`` evaluator is built (its input errors stop the run here)
    and the training data is checked for 8-gram overlap with the evaluation sets (a warning). Then rank 0 locks the
    directory for the run (`lmrl.trainers.runlock`; released when the tracker closes) and, on resume, picks the
    newest intact checkpoint (`lmrl.trainers.intact`) of a run of the same method (`rundir.check_method`)."""
    evaluator = build_evaluator(config)
    run_dir = Path(config.output_dir)
    if not runtime.is_main():  # rank 0 prepares the directory and alone writes to it
        runtime.barrier()
        checkpoint = latest_checkpoint(run_dir) if config.resume else None
        start_step = read_state(checkpoint)["step"] if checkpoint else 0
        set_seed(config.seed)
        return Run(run_dir, runtime.NullTracker(), start_step, checkpoint, evaluator)
    contaminated = contamination(config, evaluator)
    rundir.check_writable(run_dir)
    lock = runlock.acquire(run_dir, notice=console.print)  # held until the run's tracker closes
    try:
        return _open_run(config, description, run_dir, evaluator, contaminated, lock)
    except BaseException:
        lock.release()
        raise


def _open_run(config: TrainConfig, description: str, run_dir: Path, evaluator, contaminated, lock) -> Run:
    """`start_run` on rank 0, in the locked directory."""
    method = rundir.method_name(type(config).__name__, to_dict(config))
    checkpoint = intact.newest_intact(list_checkpoints(run_dir), STATE_FILE, console.print) if config.resume else None
    if checkpoint is not None:
        rundir.check_method(run_dir, method)  # a run of another verb or method is not continued
    if not config.resume and rundir.has_run(run_dir) and not config.overwrite:
        raise FileExistsError(
            f"output_dir '{run_dir}' already holds a run. Pass resume=true to continue it, overwrite=true "
            f"to replace it, or choose another output_dir=..."
        )
    if checkpoint is None and (rundir.has_run(run_dir) or rundir.own_config(run_dir)):
        # a start from step 0 replaces what lmrl wrote: an overwritten run, a start that failed before its first
        # step, or (resume=true) a run killed before its first checkpoint
        for name in ("checkpoints", "plots", "final", "metrics.jsonl", "samples.jsonl", RUN_FILE):
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    if config.resume and checkpoint is None:
        console.print(f"[yellow]resume=true but '{run_dir}' has no checkpoint yet: starting from step 0.")
    start_step = 0
    if checkpoint:
        state = read_state(checkpoint)
        start_step = state["step"]
        rundir.resume_changes(rundir.saved_config(checkpoint, state["trainer"]), to_dict(config))  # refuse early
    set_seed(config.seed)
    tracker = Tracker(run_dir, config.max_steps, to_dict(config), config.report_to, description, start_step)
    tracker.on_close.append(lock.release)
    if checkpoint:
        tracker.print(f"Resuming from {checkpoint} (step {start_step}).")
    for source, report in contaminated:
        tracker.print(f"[bold yellow]{escape(warning_text(config.dataset, source, report))}")
    runtime.barrier()
    return Run(run_dir, tracker, start_step, checkpoint, evaluator, method)


def write_run_config(run: Run, config: TrainConfig, setup: Any = None) -> None:
    """``config.yaml`` and, given the run's `ModelSetup`, the precision it resolved to (``run.json``); called
    after a resumed checkpoint has loaded, so a refused resume leaves the run's config.yaml as it was."""
    if not runtime.is_main():  # rank 0 alone writes to the run directory
        return
    rundir.write_config(run.dir, to_dict(config), precision_of(setup.dtype) if setup is not None else None, run.method)


# --------------------------------------------------------------------------- seeding and RNG


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The RNG states as plain data (ints, floats, strings, lists, tensors): loadable with weights_only=True."""
    version, words, gauss = random.getstate()
    key, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": version, "state": list(words), "gauss": gauss},
        "numpy": {
            "key": key,
            "state": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(cached),
        },
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    py, nps = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    np.random.set_state(
        (nps["key"], nps["state"].numpy().astype(np.uint32), nps["pos"], nps["has_gauss"], nps["gauss"])
    )
    torch.set_rng_state(state["torch"])


def safe_load(path: Path) -> Any:
    """torch.load with weights_only=True: tensors and plain containers only, never pickled code. A file that
    needs more (a checkpoint written before lmrl stopped pickling objects, or a crafted one) is refused."""
    import pickle

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"{path} cannot be loaded safely: it holds pickled objects, and unpickling runs code "
            f"({str(exc).splitlines()[0][:200]}). It may be a checkpoint from an lmrl version that pickled RNG "
            f"states, or a crafted file. lmrl refuses to load it; resume from a newer checkpoint, or start a new run "
            f"from its weights with model={path.parent}."
        ) from None


def epoch_batch_indices(num_rows: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Row indices of batch ``step`` (1-based) in an endless stream of seeded epoch permutations.

    A pure function of ``step``, so the data position of a run is just its step.
    """
    start = (step - 1) * batch_size
    indices: list[int] = []
    while len(indices) < batch_size:
        epoch, offset = divmod(start + len(indices), num_rows)
        perm = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        take = min(batch_size - len(indices), num_rows - offset)
        indices.extend(perm[offset : offset + take].tolist())
    return indices


# --------------------------------------------------------------------------- optimisation


def build_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over ``params`` (a module's or any iterable); weight decay only on matrices, not norms or biases."""
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    betas = tuple(config.adam_betas)
    try:  # the fused kernel is several times faster than the per-tensor loop (CPU: torch >= 2.4)
        return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=config.adam_eps, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=config.adam_eps, foreach=True)


def lr_factor(step: int, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based): linear warmup, then decay to ``min_ratio``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup + decay over ``total_steps`` optimizer steps (default ``config.max_steps``)."""
    total = total_steps or config.max_steps
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, config.warmup_steps, total, config.lr_schedule, config.min_lr_ratio)
    )


def optimizer_step(params, optimizer, scheduler, max_grad_norm: float | None, step: int) -> float:
    """Clip, check for NaN/inf, step, check the weights, zero grads; returns the pre-clip gradient norm of
    ``params`` (or a module's). Raises `TrainingDiverged` when the step multiplied the norm of the trained weights
    by more than `MAX_WEIGHT_GROWTH` (or made it non-finite): nothing after it is saved."""
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    params = [p for p in params if p.grad is not None]
    if runtime.world() > 1:  # FSDP/DDP averaged the ranks' gradients; each rank's loss is its part of the global loss
        for p in params:
            p.grad.mul_(runtime.world())
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm else float("inf"))
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a DTensor over the shards
    if not torch.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        raise TrainingDiverged(f"Gradient norm is {norm.item()} at step {step}; the update was not applied.")
    before = weight_norm(params)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    after = weight_norm(params)
    if not math.isfinite(after) or (before > 0 and after > MAX_WEIGHT_GROWTH * before):
        raise TrainingDiverged(
            f"The update of step {step} took the norm of the trained weights from {before:.4g} to {after:.4g} "
            f"(more than {MAX_WEIGHT_GROWTH:g}x in one step). Nothing after the last good checkpoint was saved "
            f"(resume=true continues from it). Try a lower lr, or max_grad_norm."
        )
    return norm.item()


def finish_step(method, step: int, t0: float, tokens: float) -> dict[str, float]:
    """The optimizer step (`optimizer_step`, with ``method.config.max_grad_norm``) that ends ``method``'s training
    step begun at ``t0`` (`time.perf_counter`), and its metrics: optim/grad_norm, lr, tokens_per_s (``tokens``
    processed over the whole step) and time/train_s."""
    grad_norm = optimizer_step(method.model, method.optimizer, method.scheduler, method.config.max_grad_norm, step)
    elapsed = time.perf_counter() - t0
    return {
        "optim/grad_norm": grad_norm,
        "lr": method.scheduler.get_last_lr()[0],
        "tokens_per_s": tokens / elapsed,
        "time/train_s": elapsed,
    }


def training_policy(setup, packed: bool) -> tuple[torch.nn.Module, Any]:
    """The setup's policy and tokenizer, ready to train: checked packable (`lmrl.data.packing`) on the plain model
    when micro-batches are ``packed``, then distributed (FSDP/DDP wrap it), in train mode."""
    model, tokenizer = setup.policy(distribute=False)
    if packed:  # on the plain model, before FSDP/DDP wrap it
        packing.check_packable(model, len(tokenizer))
    model = setup.distribute(model)
    model.train()
    return model, tokenizer


def weight_norm(params: list[torch.Tensor]) -> float:
    """The global L2 norm of ``params`` (one fused pass)."""
    if not params:
        return 0.0
    with torch.no_grad():
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(params)).float()).item()


def is_due(step: int, every: int, max_steps: int) -> bool:
    """Whether a periodic evaluation or checkpoint falls on ``step``: every ``every`` steps (0: never), except the
    last step, which every trainer evaluates and saves after its loop anyway."""
    return bool(every) and step % every == 0 and step != max_steps


def check_finite(loss: torch.Tensor, step: int) -> None:
    if not torch.isfinite(loss):
        raise TrainingDiverged(
            f"Loss is {loss.item()} at step {step}. The run stopped before applying the update; the last good "
            f"checkpoint is intact (resume=true continues from it). Try a lower lr, max_grad_norm, or precision=fp32."
        )


# --------------------------------------------------------------------------- checkpoints


def checkpoint_step(path: Path) -> int:
    return int(path.name.split("-")[1])


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        return []
    done = [p for p in ckpt_dir.glob("step-*") if (p / STATE_FILE).exists()]
    return sorted(done, key=checkpoint_step)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def save_checkpoint(
    run: Run, step: int, model, tokenizer, optimizer, scheduler, state: dict[str, Any] | None = None, keep: int = 2
) -> Path:
    """Write ``checkpoints/step-N`` atomically (tmp dir then rename) and prune to the newest ``keep``."""
    final = run.checkpoints_dir / f"step-{step}"
    tmp = run.checkpoints_dir / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_model(model, tokenizer, tmp)
        if has_frozen_weights(model):  # LoRA: the adapters (and heads) by name, for an exact resume
            save_trainable(model, tmp)
        torch.save(
            {
                "step": step,
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": rng_state(),
                "trainer": state or {},
            },
            tmp / STATE_FILE,
        )
    except (OSError, RuntimeError) as exc:  # a full disk, a quota, a lost mount: one paragraph, not a traceback
        cause = write_failure(exc, tmp)
        if cause is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise checkpoint_failed(run, step, cause) from None
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(run.dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_failed(run: Run, step: int, exc: BaseException) -> TrainingStopped:
    """The error of a checkpoint that could not be written: where, why, and that the previous one is intact."""
    previous = latest_checkpoint(run.dir)
    kept = (
        f"the previous checkpoint {previous} is intact, and resume=true continues from it"
        if previous
        else "there is no earlier checkpoint (resume=true starts again from step 0)"
    )
    why = getattr(exc, "strerror", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    return TrainingStopped(
        f"Writing checkpoint step-{step} in {run.checkpoints_dir} failed: {why}. The partial checkpoint was removed; "
        f"{kept}. Free space there (or keep fewer checkpoints: keep_checkpoints=1, save_every=...) and resume."
    )


STATE_KEYS = ("step", "trainer")  # in every checkpoint state; a single-process one also optimizer, scheduler, rng


def read_state(checkpoint: Path, required: tuple[str, ...] = STATE_KEYS) -> dict[str, Any]:
    """The checkpoint's state, with the `required` keys (a missing one is named: issue 46, was `error: trainer`)."""
    path = checkpoint / STATE_FILE
    state = safe_load(path)
    missing = [k for k in required if not isinstance(state, dict) or k not in state]
    if missing:
        held = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"{path} is not a whole lmrl checkpoint state: it lacks {', '.join(map(repr, missing))} (it holds "
            f"{held}). Move {checkpoint} out of checkpoints/ to resume from the previous one, or start a new run "
            f"from its weights with model={checkpoint}."
        )
    return state


def restore_checkpoint(
    checkpoint: Path, model, optimizer, scheduler, config: TrainConfig | None = None
) -> dict[str, Any]:
    """Load weights, optimizer, scheduler and RNG from ``checkpoint``; returns the trainer's own state.

    With ``config``: keys changed since the checkpoint are printed, a changed ``lr`` is applied to the restored
    optimizer and scheduler, and keys the checkpoint holds (`rundir.FIXED_ON_RESUME`) are refused."""
    ckpt_world.check_world(checkpoint, 1)  # a multi-process checkpoint: the fix, not "does not match the model"
    state = read_state(checkpoint, (*STATE_KEYS, "optimizer", "scheduler", "rng"))
    changes = {}
    if config is not None:
        changes = rundir.resume_changes(rundir.saved_config(checkpoint, state["trainer"]), to_dict(config))
    if (checkpoint / TRAINABLE_FILE).exists():
        load_trainable(model, checkpoint)  # LoRA: the frozen base is the one loaded at start-up
    else:
        load_full_weights(model, checkpoint)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    if "lr" in changes:
        rundir.apply_lr(optimizer, scheduler, *changes["lr"])
    if changes:
        console.print(
            "resume: changed since the checkpoint (applied): "
            + escape(", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()))
        )
    return state["trainer"]


def load_full_weights(model, checkpoint: Path) -> None:
    from safetensors.torch import load_file

    weights = {}
    for shard in sorted(checkpoint.glob("*.safetensors")):
        weights.update(load_file(shard))
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as exc:  # size mismatches
        first = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line), str(exc)[:200])
        raise ValueError(
            f"Checkpoint {checkpoint} holds another model architecture ({first}). Resume with the "
            f"run's model and model_args (its config.yaml), or start a new run."
        ) from None
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"Checkpoint {checkpoint} does not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}. Resume with the run's model and model_args "
            f"(its config.yaml), or start a new run."
        )


def save_final(run: Run, model, tokenizer, merge_lora: bool = False, name: str = "final") -> Path:
    """``output_dir/final`` (or ``name``): the trained model in HF format, loadable with ``model=<run>/final``; with
    LoRA the adapter (loads as base + adapter), or with ``merge_lora`` the merged model and the adapter in adapter/."""
    try:
        if is_peft(model):
            return save_adapter(model, tokenizer, run.dir / name, merge=merge_lora)
        return save_model(model, tokenizer, run.dir / name)
    except (OSError, RuntimeError) as exc:  # a full disk at the end: the last checkpoint holds the same weights
        cause = write_failure(exc, run.dir)
        if cause is None:
            raise
        previous = latest_checkpoint(run.dir)
        raise TrainingStopped(
            f"Writing the model to {run.dir / name} failed: {cause.strerror or cause}. "
            + (f"The checkpoint {previous} holds the trained weights; " if previous else "")
            + "free space there and run again with resume=true to write it."
        ) from None
