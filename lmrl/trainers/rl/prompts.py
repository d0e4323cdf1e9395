"""The prompts of `lmrl rl`: the training and held-out rows, their columns per completion, the longest prompt (the
engine=vllm context check), and the held-out evaluation (task accuracy, or tool/env episodes)."""

from __future__ import annotations

from typing import Any

from lmrl.data.loading import check_prompt, is_generated, load_rows, row_where
from lmrl.data.prompt_format import PromptFormat
from lmrl.eval.generation import task_accuracy
from lmrl.trainers import agentic
from lmrl.trainers.rl.config import RLConfig


def repeat_columns(rows: list[dict[str, Any]], group_size: int) -> dict[str, list]:
    """Dataset columns of each prompt, repeated for its G completions (prompt-major)."""
    keys = [k for k in rows[0] if k not in ("prompt", "completion")]
    return {k: [row[k] for row in rows for _ in range(group_size)] for k in keys}


def evaluate(
    model, tokenizer, eval_rows, config: RLConfig, dtype, env_factory=None
) -> tuple[dict[str, float], list[dict]]:
    if not eval_rows or "task" not in eval_rows[0]:
        return {}, []
    if env_factory is not None:
        return agentic.evaluate_episodes(model, tokenizer, eval_rows, config, dtype, env_factory)
    metrics, samples = task_accuracy(
        model,
        tokenizer,
        eval_rows,
        config.max_new_tokens,
        dtype,
        num_samples=config.num_samples,
        prompt_format=PromptFormat.from_config(config),
        stop_strings=tuple(config.stop),
    )
    return {"eval/accuracy": metrics["accuracy"]}, samples


def longest_prompt(tokenizer, rows: list[dict], config: RLConfig) -> int:
    """Tokens of the longest prompt as the model reads it (the engine=vllm context check at start-up)."""
    prompt_format = PromptFormat.from_config(config)
    return max(len(prompt_format.ids(tokenizer, row["prompt"])) for row in rows)


def load_prompts(config: RLConfig) -> tuple[list[dict], list[dict]]:
    """Training prompts and, for built-in tasks, held-out prompts; a dataset without a prompt column fails here."""
    rows = load_rows(config.dataset, split="train", limit=config.train_rows, **config.task_args)
    if not rows or "prompt" not in rows[0]:
        raise ValueError(
            f"Dataset {config.dataset} needs a 'prompt' column; found {sorted(rows[0]) if rows else 'no rows'}."
        )
    for i, row in enumerate(rows):  # text or messages, or a message naming the row (not a traceback mid-run)
        check_prompt(row.get("prompt"), row_where(i, config.dataset))
    eval_rows = (
        load_rows(config.dataset, split="test", limit=config.eval_rows, **config.task_args)
        if is_generated(config.dataset)
        else []
    )
    return rows, eval_rows
