"""lm-evaluation-harness on lmrl checkpoints (optional extra: ``pip install -e '.[eval]'``).

A run's ``final/`` or ``checkpoints/step-N/`` is a Hugging Face model directory (weights, config, tokenizer), so
the harness's own ``hf`` backend loads it; nothing is converted. Tasks are any the harness knows, or local YAML
tasks in ``include_path`` (e.g. over a JSONL file with ``dataset_path: json``, which reads local files only):

    lmrl eval model=runs/sft/final harness_tasks=[my_task] harness_include=tasks/ metrics=[accuracy]
    lm_eval --model hf --model_args pretrained=runs/sft/final --tasks my_task --include_path tasks/   # the same

`write_task` writes such a YAML task for rows of lmrl's formats.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

INSTALL = "lm-evaluation-harness is not installed: pip install -e '.[eval]' (or pip install lm-eval)."


def _lm_eval():
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ValueError(INSTALL) from None
    return lm_eval, TaskManager


def check_model_dir(model: str) -> None:
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"harness_tasks: model '{model}' is not a local HF model directory (config.json). Use a run's "
            "final/ or checkpoints/step-N/ (built-in models are made at load time; save one first)."
        )


def write_task(directory: str | Path, name: str, rows: list[dict[str, Any]], kind: str = "multiple_choice") -> Path:
    """A local harness task over ``rows`` (written as ``<name>.jsonl``): ``multiple_choice`` (prompt, choices,
    answer index) scored by log-likelihood, or ``generate_until`` (prompt, answer) scored by exact match."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task: dict[str, Any] = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.resolve())}},
        "test_split": "test",
        "output_type": kind,
        "doc_to_text": "{{prompt}}",
    }
    if kind == "multiple_choice":
        task.update(
            doc_to_choice="{{choices}}",
            doc_to_target="answer",
            target_delimiter="",
            metric_list=[
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
            ],
        )
    elif kind == "generate_until":
        task.update(
            doc_to_target="{{answer}}",
            target_delimiter="",
            generation_kwargs={"until": ["\n"], "max_gen_toks": 32, "do_sample": False},
            metric_list=[{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        )
    else:
        raise ValueError(f"write_task: kind must be multiple_choice or generate_until, got {kind!r}.")
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path


def run_harness(
    model: str,
    tasks: list[str],
    include_path: str | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    log_samples: bool = False,
) -> dict[str, Any]:
    """``lm_eval.simple_evaluate`` with the ``hf`` backend on a local model directory, CPU, fp32; returns the
    harness's result dict (``results[task][metric,filter]``, and ``samples`` with ``log_samples``)."""
    lm_eval, TaskManager = _lm_eval()
    check_model_dir(model)
    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(
            f"harness_tasks: unknown task(s) {unknown}; give a harness task name or a YAML task in "
            f"harness_include={include_path!r}."
        )
    return lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={model},dtype=float32",
        tasks=tasks,
        task_manager=manager,
        batch_size=batch_size,
        device="cpu",
        limit=limit,
        log_samples=log_samples,
    )


def flat_metrics(results: dict[str, Any]) -> dict[str, float]:
    """``harness/<task>/<metric>`` for every numeric result (the filter suffix ``,none`` dropped)."""
    out = {}
    for task, values in results.get("results", {}).items():
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and "," in key:
                metric, _, filt = key.partition(",")
                out[f"harness/{task}/{metric}" + ("" if filt == "none" else f"/{filt}")] = float(value)
    return out
