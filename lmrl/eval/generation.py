"""Generation-based evaluation: greedy (or sampled) answers to held-out prompts, scored by their task."""

from __future__ import annotations

from typing import Any

import torch

from lmrl.data.prompt_format import PromptFormat
from lmrl.data.tasks import get_task
from lmrl.rollout.engines.hf import HFEngine, SamplingParams


def task_accuracy(
    model,
    tokenizer,
    rows: list[dict[str, Any]],
    max_new_tokens: int = 32,
    autocast_dtype: torch.dtype | None = None,
    batch_size: int = 64,
    num_samples: int = 4,
    prompt_format: PromptFormat | None = None,
    stop_strings: tuple[str, ...] = (),
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy pass@1 of ``model`` on built-in task rows (columns prompt, answer, task, meta), each prompt encoded
    by ``prompt_format`` and ended at ``stop_strings`` (as the run samples them; default: the chat template, no stop).

    Returns ``{"accuracy": mean score}`` and the first ``num_samples`` rows as sample records.
    """
    prompt_format = prompt_format or PromptFormat()
    engine = HFEngine(model, tokenizer, autocast_dtype=autocast_dtype)
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True, stop_strings=stop_strings)
    scores: list[float] = []
    samples: list[dict[str, Any]] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        prompt_ids = [prompt_format.ids(tokenizer, r["prompt"]) for r in chunk]
        batch = engine.generate(prompt_ids, params, n=1)
        for row, completion in zip(chunk, batch.completions):
            score = get_task(row["task"]).score(completion, row["answer"], row["meta"])
            scores.append(score)
            if len(samples) < num_samples:
                samples.append(
                    {"prompt": row["prompt"], "completion": completion, "answer": row["answer"], "score": score}
                )
    accuracy = sum(scores) / max(1, len(scores))
    return {"accuracy": accuracy}, samples
