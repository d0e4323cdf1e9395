"""The training loop every method shares, written once.

A method (SFT, DPO, GRPO, self-play, ...) supplies only what is its own, as an object with

    model, tokenizer          saved in every checkpoint and in ``final/``
    optimizer, scheduler      saved and restored with the checkpoint
    step(step) -> metrics     one training step: forward, backward, optimizer step(s)
    evaluate(step) -> (metrics, samples)
    state_dict() / load_state_dict(state)   the method's extra checkpoint state (e.g. a value model)

    describe(run) -> str      the start-up line

and the optional members of `Method` (``samples_title``, ``initial_metrics``, ``data_parallel``, ``setup``,
``checkpoint_module``, ``env_factory``, ``start``, ``stop``, ``close``) with the defaults of `MethodDefaults`, its base. The loop
gives the method its tracker as ``method.tracker`` (for samples and notices during a step).

With several processes (torchrun, ``nproc=N``) each rank's ``step`` trains on its share of the global batch; the
loop reduces the metrics over ranks, evaluates on rank 0 (every FSDP-sharded model unsharded meanwhile), saves
checkpoints with torch.distributed.checkpoint and ``final/`` as one HF directory (`lmrl.trainers.dist_checkpoint`).

`run` owns the rest, in this order: resume (then ``config.yaml``) or initial evaluation, the step loop with periodic
log/eval/checkpoint, divergence (the tracker is closed, the last good checkpoint kept), final
evaluation, final checkpoint and ``final/`` model, plots. Open the run with `common.start_run` after
everything that can fail on bad input (config, data, rewards, models) has loaded.

    def train(config): return loop.train(SFT, config, "sft")   # = SFT(config, ModelSetup.from_config(config)),
                                                                # common.start_run, method.start(run), loop.run
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from lmrl.config import TrainConfig, to_dict
from lmrl.eval.training import evals_metrics
from lmrl.models import memory
from lmrl.parallel import runtime
from lmrl.report.metric_names import current_name
from lmrl.rewards.errors import SKIPPED
from lmrl.trainers import common, dist_checkpoint
from lmrl.trainers.best import BestKeeper


class Method(Protocol):
    """What `run` reads from a method. The first group every method defines; the second has defaults in
    `MethodDefaults`, which every method class takes as its base (defaults only: no behaviour is inherited)."""

    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any

    def step(self, step: int) -> dict[str, float]:
        """One training step: forward, backward, optimizer step(s); its metrics."""

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Held-out metrics and samples (rank 0 only, with every sharded model gathered)."""

    def describe(self, run: common.Run) -> str:
        """The start-up line: the model, the data, the precision, the run directory."""

    samples_title: str
    """heading of the evaluation samples"""
    initial_metrics: dict[str, float]
    """logged at step 0 and returned with the final metrics (e.g. a warm start's or a teacher's)"""
    data_parallel: bool
    """runs on several processes, each ``step`` on its rank's share of the batch"""
    setup: Any
    """its `ModelSetup` (precision, the sharded models to gather for evaluation), or None"""
    checkpoint_module: torch.nn.Module | None
    """what a multi-process checkpoint's DCP shards hold (None: ``model``), e.g. PPO's policy and value model"""
    env_factory: Any
    """row -> environment of a run with tools or an env (``eval_metrics`` then run tool episodes), or None"""

    def start(self, run: common.Run) -> None:
        """Work after the run directory opened and before the first step (e.g. self-play's warm start)."""

    def stop(self, metrics: dict[str, float]) -> str | None:
        """A reason to stop early after an evaluation, or None."""

    def close(self) -> None:
        """Free what the method holds (engines, workers) at the end or on failure."""

    def state_dict(self) -> dict[str, Any]:
        """The method's own checkpoint state beyond weights, optimizer, scheduler and RNG."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`'s state on resume."""


class MethodDefaults:
    """The defaults of `Method`'s optional members."""

    samples_title = "held-out samples"
    initial_metrics: dict[str, float] = {}  # read, never mutated: a method assigns its own dict
    data_parallel = False
    setup = None
    checkpoint_module = None
    env_factory = None

    def start(self, run: common.Run) -> None:
        pass

    def stop(self, metrics: dict[str, float]) -> str | None:
        return None

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def train(method_class, config: TrainConfig, name: str) -> dict[str, float]:
    """Every method's entry: its models and data (every input error surfaces here, before the run directory is
    touched), the run directory, the start-up line, the method's `start`, then `run`."""
    from lmrl.models.setup import ModelSetup
    from lmrl.rollout.tools.section import ToolSection, start_servers

    if isinstance(config, ToolSection):
        start_servers(config)  # an MCP server that does not start stops the run here, before any model loads
    method = method_class(config, ModelSetup.from_config(config))
    run_dir = common.start_run(config, name)
    try:
        run_dir.tracker.print(method.describe(run_dir))
        method.start(run_dir)
    except BaseException:  # a failed or interrupted start (e.g. a warm start): stop the progress bar, free the lock
        run_dir.tracker.close()
        raise
    return run(config, method, run_dir)


def close_after_failure(tracker, method) -> None:
    """After a failure: close the tracker (plots, the run lock) and the method, without letting an error of theirs
    replace the first one (issue 46: the plots, drawn on the disk that was full, raised a second error that was
    the one shown)."""
    for what, close in (("writing the plots and closing the tracker", tracker.close), ("closing", method.close)):
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - reported in one line; the first error is re-raised by the caller
            first = (str(exc).splitlines() or [""])[0][:200]
            tracker.print(f"[yellow]After the error below, {what} failed too ({type(exc).__name__}: {first}).")


def is_log_step(step: int, every: int, max_steps: int) -> bool:
    """Metrics are logged every ``every`` steps, and always at the first and the last step."""
    return step % every == 0 or step in (1, max_steps)


def run(config: TrainConfig, method: Method, run: common.Run) -> dict[str, float]:
    """Train ``method`` from ``run.start_step`` to ``config.max_steps``; returns the final evaluation metrics
    with the initial ones as ``initial/<name>`` (and the method's ``initial_metrics``)."""
    tracker = method.tracker = run.tracker  # the method may print and log samples during its steps
    title, extra = method.samples_title, dict(method.initial_metrics)
    if runtime.world() > 1 and not method.data_parallel:
        raise ValueError(
            f"{type(method).__name__} does not run on several processes yet (nproc/torchrun); "
            "SFT, DPO (offline and online), distillation, reward models, online RL, self-play and "
            "pretrain do. Fix: nproc=1."
        )
    try:  # a failure before the first step (restore, the initial evaluation) also stops the bar and frees the lock
        initial, best = begin(config, method, run, extra, title)
    except BaseException:
        close_after_failure(tracker, method)
        raise
    last_step, skipped = config.max_steps, 0
    try:
        for step in range(run.start_step + 1, config.max_steps + 1):
            metrics = method.step(step)
            skipped += bool(metrics.get(SKIPPED))
            if is_log_step(step, config.log_every, config.max_steps):  # /proc read only for the steps logged
                tracker.log(step, runtime.reduce_metrics({**metrics, **memory.step_metrics()}))
            else:
                tracker.advance(step)
            if common.is_due(step, config.eval_every, config.max_steps):
                metrics, samples = evaluate(method, step, run, best)
                tracker.log(step, metrics)
                tracker.log_samples(step, samples, title, held_out=True)
                reason = method.stop(metrics)
                if reason:
                    tracker.print(f"{reason}: stopping at step {step}.")
                    last_step = step
                    break
            if common.is_due(step, config.save_every, config.max_steps):
                save(run, step, method, initial, config)
        check_trained(skipped, last_step - run.start_step)
        final, samples = evaluate(method, last_step, run, best)
        tracker.log(last_step, final)
        tracker.log_samples(last_step, samples, title, held_out=True)
        save(run, last_step, method, initial, config)
        saver = dist_checkpoint.save_final if runtime.world() > 1 else common.save_final
        final_dir = saver(run, method.model, method.tokenizer, config.merge_lora)
    except BaseException:  # divergence, Ctrl-C, a crash, a full disk: stop the progress bar, free the run lock;
        close_after_failure(tracker, method)  # the last good checkpoint stays
        raise
    plots = tracker.close()
    method.close()  # e.g. placement=ray's rollout workers
    tracker.print(f"Final model: {final_dir}  plots: {run.dir / 'plots'} ({len(plots)} files)")
    return {**initial, **final}


def check_trained(skipped: int, steps: int) -> None:
    """A run whose every step a failing reward function skipped trained nothing: it stops (exit 1) instead of saving
    the unchanged model as final/ (a run shorter than max_skipped_steps would otherwise end as if trained)."""
    if steps and skipped == steps:
        raise common.TrainingStopped(
            f"every one of the {steps} steps of this run was skipped because a reward function failed (the "
            "messages above say which and why): nothing was trained, so no final/ model is written. Fix the "
            "reward function; on_reward_error=stop stops at its first failure."
        )


def begin(config: TrainConfig, method: Method, run: common.Run, extra: dict, title: str):
    """Resume (restore the checkpoint and the method's state) or evaluate at step 0; config.yaml; the best keeper.
    Returns the initial metrics and the keeper."""
    initial: dict[str, float] = {}
    if run.checkpoint:
        state = restore(run.checkpoint, method, config)
        initial = {current_name(k): v for k, v in state.get("initial", {}).items()}  # an older run's names too
        method.load_state_dict(state)
    common.write_run_config(run, config, method.setup)
    best = BestKeeper(run.dir, config.keep_best, config.keep_best_mode) if config.keep_best else None
    if not run.checkpoint:
        metrics, samples = evaluate(method, 0, run, best)
        initial = {**{f"initial/{k}": v for k, v in metrics.items()}, **extra}
        run.tracker.log(0, {**metrics, **extra})
        run.tracker.log_samples(0, samples, title, held_out=True)
    return initial, best


def evaluate(
    method: Method, step: int, run: common.Run, best: BestKeeper | None = None
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The method's evaluation plus ``eval/metrics/<name>`` of the run's ``eval_metrics`` (`lmrl.eval`), if any. Several
    processes: rank 0 evaluates the unsharded model and every rank gets its result. ``best`` (keep_best): the model
    is saved as ``best/`` when the evaluation beats the best so far."""
    setup = method.setup
    result = None
    with runtime.full_params(*getattr(setup, "sharded", [])):
        if runtime.is_main():
            metrics, samples = method.evaluate(step)
            dtype = getattr(setup, "dtype", None)
            evals = evals_metrics(run.evaluator, method.model, method.tokenizer, dtype, method.env_factory)
            result = {**metrics, **evals}, samples
    result = runtime.broadcast_object(result)
    if best is not None:
        best.offer(run, step, result[0], method.model, method.tokenizer)
    return result


def save(run: common.Run, step: int, method: Method, initial: dict[str, float], config: TrainConfig) -> None:
    """``checkpoints/step-N``: weights, optimizer, scheduler, RNG, the initial metrics and the method's state."""
    if runtime.world() > 1:
        save_checkpoint, model = dist_checkpoint.save_checkpoint, method.checkpoint_module or method.model
    else:
        save_checkpoint, model = common.save_checkpoint, method.model
    save_checkpoint(
        run,
        step,
        model,
        method.tokenizer,
        method.optimizer,
        method.scheduler,
        {"initial": initial, "config": to_dict(config), **method.state_dict()},
        config.keep_checkpoints,
    )


def restore(checkpoint, method: Method, config: TrainConfig) -> dict[str, Any]:
    """One process: `common.restore_checkpoint` (a changed lr applied, fixed keys refused); several: DCP."""
    if runtime.world() > 1:
        model = method.checkpoint_module or method.model
        return dist_checkpoint.restore_checkpoint(checkpoint, model, method.optimizer, method.scheduler)
    return common.restore_checkpoint(checkpoint, method.model, method.optimizer, method.scheduler, config)
