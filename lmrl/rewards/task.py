"""`task`: the built-in tasks' own checkers (tasks own their reward, STYLE.md §12)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmrl.rewards.columns import as_meta, get_column
from lmrl.rewards.registry import RewardFn, register_reward


@register_reward("task")
def make_task_reward(task: str | None = None) -> RewardFn:
    """`task`: r_i = get_task(task_i).score(completion_i, answer_i, meta_i) (lmrl.data.tasks).

    task_i comes from the `task` column; the `task` option names one task for datasets
    without that column. meta_i may be a dict, a JSON object string, or absent ({}).
    Task objects are built once per name and cached.
    """
    if task is not None and (not isinstance(task, str) or not task):
        raise ValueError(f"Reward 'task': the task option must be a task name, got {task!r}.")
    cache: dict[str, Any] = {}

    def task_reward(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        from lmrl.data.tasks import get_task  # data layer, imported on first use

        n = len(completions)
        if task is not None and columns.get("task") is None:
            names: Sequence[str] = [task] * n
        else:
            hint = "It names each sample's task; or set reward_kwargs.task.task."
            names = get_column(columns, "task", n, "task", hint)
        answers = get_column(columns, "answer", n, "task", "It holds each sample's reference answer.")
        metas = get_column(columns, "meta", n, "task") if columns.get("meta") is not None else [None] * n
        rewards = []
        for name, completion, answer, meta in zip(names, completions, answers, metas):
            if name not in cache:
                cache[name] = get_task(name)
            rewards.append(float(cache[name].score(completion, answer, as_meta(meta))))
        return rewards

    task_reward.__name__ = "task"
    return task_reward
