"""`lmrl eval`'s metrics inside any trainer (``eval_metrics=[...]``) and the start-up contamination warning.

The shared loop (`lmrl.trainers.loop`) adds ``eval/metrics/<name>`` for every metric to each evaluation it logs, so they
land in metrics.jsonl next to the method's own. The rows come from ``eval_metrics_dataset``, else the test split
of a built-in task dataset (``dataset=task:...``), else ``eval_dataset``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from lmrl.config import ConfigError, DataSection, EvalSection, RowsSection, TaskSection
from lmrl.data.loading import is_generated, load_rows
from lmrl.eval.decontam import OverlapReport, overlap
from lmrl.eval.runner import EvalOptions, Evaluator
from lmrl.rollout.tools.section import ToolSection


def eval_source(config: EvalSection) -> tuple[str | None, str, dict]:
    """(source, split, task_args) of the rows of ``eval_metrics``: eval_metrics_dataset, else the test split of a
    built-in task dataset, else the verb's held-out dataset (`EvalSection.held_out_dataset`)."""
    task_args = dict(config.task_args) if isinstance(config, TaskSection) else {}
    if config.eval_metrics_dataset:
        source = config.eval_metrics_dataset
        return source, "test" if is_generated(source) else "train", task_args if is_generated(source) else {}
    if isinstance(config, RowsSection) and is_generated(config.dataset):
        return config.dataset, "test", task_args
    held_out = config.held_out_dataset()
    if held_out:
        split = config.eval_split if isinstance(config, DataSection) else "test"
        return held_out, split, task_args if is_generated(held_out) else {}
    return None, "test", {}


def build_evaluator(config: EvalSection) -> Evaluator | None:
    """The trainer's evaluator for ``eval_metrics`` (None when empty); every input error raised here, at start-up."""
    if not config.eval_metrics:
        return None
    source, split, task_args = eval_source(config)
    if source is None:
        raise ConfigError(
            "eval_metrics needs evaluation rows: set eval_metrics_dataset=task:<name> or a file with "
            "prompt and answer columns."
        )
    names = {f.name for f in dataclasses.fields(EvalOptions)}
    unknown = sorted(set(config.eval_metrics_args) - names)
    if unknown:
        raise ConfigError(f"eval_metrics_args: unknown option(s) {unknown}; known: {sorted(names)}.")
    args = {"seed": config.seed, "num_samples": 0, **config.eval_metrics_args}
    rows = load_rows(source, split=split, limit=config.eval_metrics_rows, **task_args)
    turns = config.turn_options() if isinstance(config, ToolSection) and config.multi_turn else None  # tool episodes
    return Evaluator(config.eval_metrics, rows, EvalOptions(**args), source, key="eval_metrics", turns=turns)


def evals_metrics(evaluator: Evaluator | None, model, tokenizer, dtype=None, env_factory=None) -> dict[str, float]:
    """``eval/metrics/<name>`` of ``evaluator`` on ``model`` (empty without an evaluator); with the run's ``env_factory``
    (tools or an env) every completion is a tool episode, as in `lmrl eval tools=[...]`."""
    if evaluator is None:
        return {}
    metrics, _ = evaluator(model, tokenizer, dtype, env_factory=env_factory)
    return {f"eval/metrics/{k}": v for k, v in metrics.items() if k != "rows"}


def contamination(config: EvalSection, evaluator: Evaluator | None, n: int = 8) -> list[tuple[str, OverlapReport]]:
    """8-gram overlap of the training rows (``dataset``) with each evaluation set the run uses (``eval_dataset``,
    the eval_metrics rows); only the sets with contaminated rows are returned. Sources that are not row data
    (built-in preference sources, corpora) are skipped."""
    if not config.check_contamination or not isinstance(config, RowsSection) or not _local_rows(config.dataset):
        return []
    data = config.data
    task_args = dict(config.task_args) if isinstance(config, TaskSection) else {}
    evals: dict[str, list[dict]] = {}
    try:
        train = load_rows(
            data.dataset,
            split=data.split if isinstance(data, DataSection) else "train",
            limit=data.train_rows,
            **(task_args if is_generated(data.dataset) else {}),
        )
        if isinstance(data, DataSection) and _local_rows(data.eval_dataset):
            evals[data.eval_dataset] = load_rows(
                data.eval_dataset,
                split=data.eval_split,
                limit=data.eval_rows,
                **(task_args if is_generated(data.eval_dataset) else {}),
            )
    except (ValueError, FileNotFoundError, TypeError):
        return []  # not row data: the trainer's own loading reports real problems
    if evaluator is not None:
        evals[evaluator.source] = evaluator.rows
    found = []
    for source, rows in evals.items():
        report = overlap(train, rows, n=n)
        if report.contaminated:
            found.append((source, report))
    return found


def _local_rows(source: Any) -> bool:
    """A built-in task or a local file/directory (hub ids are not fetched again just for this check)."""
    return isinstance(source, str) and (is_generated(source) or os.path.exists(os.path.expanduser(source)))


def warning_text(train_source: str, source: str, report: OverlapReport) -> str:
    shown = report.contaminated[:10]
    return (
        f"warning: {len(report.contaminated)} of {report.eval_rows} eval rows of {source} share >= "
        f"{report.threshold:.0%} of their {report.n}-grams with the training data {train_source} (rows {shown}"
        f"{' ...' if len(report.contaminated) > 10 else ''}): their scores may measure memorisation. "
        f"`lmrl decontaminate train={train_source} eval={source}` lists them; check_contamination=false hides this."
    )
