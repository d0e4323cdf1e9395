"""reasoning-gym's procedural tasks as lmrl tasks: ``dataset=rg:<name>`` (or a weighted mix ``rg:<a>+<b>``).

reasoning-gym (Stojanovski et al. 2025, on PyPI: ``pip install 'lmrl[rg]'``) generates problems with their own
verifiers; it is the task library the SAPO paper trained its swarms on. Each row is a built-in-style row
(``task``, ``prompt``, ``completion``, ``answer``, ``meta``) whose ``task`` is ``rg:<dataset>``, so
``get_task(row["task"]).score(completion, row["answer"], row["meta"])`` re-scores it anywhere (the ``task`` reward,
`lmrl eval`, `lmrl filter`, swarm peers) with reasoning-gym's ``score_answer`` on the extracted answer
(`extract_answer`: the last ``<answer>...</answer>`` or ``\\boxed{}``, else the whole completion).

    lmrl rl dataset=rg:chain_sum task_args='{min_terms: 2, max_terms: 3}'
    lmrl rl dataset=rg:chain_sum+basic_arithmetic task_args='{weights: {chain_sum: 2}, chain_sum: {max_terms: 3}}'

One dataset: ``task_args`` is its config. A mix: ``task_args.weights`` (default 1 each) and one config dict per
dataset name, drawn through reasoning-gym's ``composite`` dataset. Train and test are disjoint: a problem belongs
to the test split by the hash of its prompt (`split_of`), as for the built-in tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, ClassVar

from lmrl.data.tasks.base import Example, Task, extract_answer, split_of

PREFIX = "rg:"


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError(
            "dataset=rg:<name> needs reasoning-gym: pip install 'lmrl[rg]' (or pip install reasoning-gym)."
        ) from None
    return reasoning_gym


@functools.cache
def _scorer(dataset: str):
    return _reasoning_gym().get_score_answer_fn(dataset)


@functools.lru_cache(maxsize=64)
def _lazy_dataset(dataset: str, config_json: str):
    """A reasoning-gym dataset of 2^31 items (each generated on access from its index), for drawing by index."""
    return _reasoning_gym().create_dataset(dataset, size=2**31 - 1, seed=0, **json.loads(config_json))


def to_row(entry: dict[str, Any], default_source: str) -> dict[str, Any]:
    """A reasoning-gym item as an lmrl row; ``meta`` made JSON-safe (it travels in swarm payloads)."""
    meta = json.loads(json.dumps(entry.get("metadata", {}), default=str))
    answer = str(entry["answer"])
    return {
        "task": PREFIX + meta.get("source_dataset", default_source),
        "prompt": entry["question"],
        "completion": answer,
        "answer": answer,
        "meta": meta,
    }


@dataclasses.dataclass
class ReasoningGym(Task):
    """One reasoning-gym dataset (``dataset``: its name; ``config``: its generation parameters) as a task family:
    its verifier, and single problems drawn by `sample` (the swarm's per-question draws)."""

    name: ClassVar[str] = "rg"
    dataset: str = "basic_arithmetic"
    config: dict = dataclasses.field(default_factory=dict)

    def sample(self, rng) -> Example:
        data = _lazy_dataset(self.dataset, json.dumps(self.config, sort_keys=True))
        row = to_row(data[rng.randrange(len(data))], self.dataset)
        return Example(task=row["task"], prompt=row["prompt"], answer=row["answer"], meta=row["meta"])

    def parse(self, completion: str) -> str | None:
        return extract_answer(completion) or None

    def score(self, completion: str, answer: str, meta: dict) -> float:
        """reasoning-gym's score of the extracted answer in [0, 1] (partial credit where the dataset gives it);
        never raises."""
        try:
            parsed = self.parse(completion) if isinstance(completion, str) and len(completion) <= 2000 else None
            if parsed is None:
                return 0.0
            entry = {"question": "", "answer": answer, "metadata": dict(meta or {})}
            return float(min(1.0, max(0.0, _scorer(self.dataset)(answer=parsed, entry=entry))))
        except Exception:  # a verifier must survive any string a policy can emit
            return 0.0


def dataset_names(spec: str) -> list[str]:
    """``rg:a+b`` -> ["a", "b"], each checked against reasoning-gym's registry."""
    names = [n.strip() for n in spec.removeprefix(PREFIX).split("+") if n.strip()]
    known = _reasoning_gym().factory.DATASETS
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        import difflib

        hints = [
            f"{n!r} (did you mean {difflib.get_close_matches(n, known, n=1)[0]!r}?)"
            if difflib.get_close_matches(n, known, n=1)
            else repr(n)
            for n in unknown
        ]
        raise ValueError(
            f"{spec}: unknown reasoning-gym dataset(s) {', '.join(hints) or '(none given)'}; "
            f"{len(known)} exist, e.g. {sorted(known)[:8]}."
        )
    return names


def _generate(names: list[str], size: int, seed: int, task_args: dict[str, Any]):
    rg = _reasoning_gym()
    if len(names) == 1:
        return rg.create_dataset(names[0], size=size, seed=seed, **task_args)
    from reasoning_gym.composite import DatasetSpec

    weights = dict(task_args.get("weights", {}))
    extra = sorted(set(task_args) - {"weights", *names})
    if extra or set(weights) - set(names):
        raise ValueError(
            f"rg:{'+'.join(names)}: task_args takes 'weights' and one config per dataset "
            f"({names}); got unknown keys {extra or sorted(set(weights) - set(names))}."
        )
    specs = [DatasetSpec(n, float(weights.get(n, 1.0)), dict(task_args.get(n, {}))) for n in names]
    return rg.create_dataset("composite", size=size, seed=seed, datasets=specs)


def rg_rows(spec: str, split: str, n: int, seed: int, task_args: dict[str, Any], allow_fewer: bool) -> list[dict]:
    """``n`` rows of ``split`` from reasoning-gym dataset(s) ``spec`` (``rg:a`` or ``rg:a+b``), deterministic."""
    names = dataset_names(spec)
    rows: list[dict] = []
    seen: set[str] = set()
    for attempt in range(4):  # the test split is ~10% of problems: draw more until n are found
        size = (n * 12 + 100) * (attempt + 1)
        for entry in _generate(names, size, seed + attempt, task_args):
            question = entry["question"]
            if question in seen or split_of(question) != split:
                continue
            seen.add(question)
            rows.append(to_row(entry, names[0]))
            if len(rows) == n:
                return rows
    if not rows or not allow_fewer:
        raise ValueError(
            f"{spec}: found only {len(rows)} distinct {split} problems of the {n} asked; lower the "
            "row count or widen the dataset's config."
        )
    return rows
