"""Built-in procedurally generated tasks with ground-truth answers and verifiers (no network).

task = get_task("countdown", n_numbers=4)
rows = make_rows(task, 1000, split="train", seed=0)
reward = get_task(row["task"]).score(completion, row["answer"], row["meta"])
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

from lmrl.config import coerce
from lmrl.data.tasks.arithmetic import Arithmetic
from lmrl.data.tasks.base import Example, Task, extract_answer, make_rows, split_of
from lmrl.data.tasks.code import Code
from lmrl.data.tasks.countdown import Countdown
from lmrl.data.tasks.linear import Linear
from lmrl.data.tasks.reasoning_gym import PREFIX as RG_PREFIX
from lmrl.data.tasks.reasoning_gym import ReasoningGym, dataset_names
from lmrl.data.tasks.sorting import Sorting
from lmrl.data.tasks.strings import Count, Reverse
from lmrl.data.tasks.tool_arithmetic import ToolArithmetic

TASKS: dict[str, type[Task]] = {
    cls.name: cls for cls in (Arithmetic, Countdown, Sorting, Reverse, Count, Linear, ToolArithmetic, Code)
}
"""Task families by name."""


def get_task(name: str, **kwargs) -> Task:
    """The task family `name` configured with `kwargs` (its dataclass fields); ``rg:<dataset>`` is a
    reasoning-gym dataset's verifier (`lmrl.data.tasks.reasoning_gym`)."""
    if name.startswith(RG_PREFIX):
        names = dataset_names(name)  # an unknown dataset raises: a swarm peer's row is then dropped, not scored
        if len(names) != 1:
            raise ValueError(f"{name!r} names a mix; a row's task is one reasoning-gym dataset (rg:<name>).")
        return ReasoningGym(dataset=names[0], config=dict(kwargs))
    if name not in TASKS:
        close = difflib.get_close_matches(name, TASKS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown task {name!r}; the tasks are {sorted(TASKS)}.{hint}")
    cls = TASKS[name]
    params = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(f"task {name!r} has no parameter(s) {unknown}; its parameters are {params}.")
    hints = typing.get_type_hints(cls)
    try:
        return cls(**{k: coerce(f"task_args.{k}", v, hints.get(k, Any)) for k, v in kwargs.items()})
    except TypeError as exc:  # a value no annotation caught
        raise ValueError(f"task {name!r}: bad task_args ({exc}); its parameters are {params}.") from None


__all__ = ["TASKS", "Example", "Task", "extract_answer", "get_task", "make_rows", "split_of"]
