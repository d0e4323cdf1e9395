"""Evaluation of tool-use episodes: pass@k, τ-bench pass^k, and the score of an episode's final answer.

Tool episodes are evaluated by the `Evaluator` (`lmrl.eval.runner`) given an environment factory: `lmrl eval
tools=[...]`, a trainer's held-out tool accuracy and its ``eval_metrics`` share it. pass@k is the chance that at
least one of k trials succeeds; pass^k (τ-bench, Yao et al. 2024) the chance that all k succeed, which measures
reliability. From n >= k trials of which c succeed, both are estimated without bias (Chen et al. 2021 for pass@k):

    pass@k = 1 - C(n-c, k) / C(n, k)        pass^k = C(c, k) / C(n, k)      (`lmrl.eval.metrics`)
"""

from __future__ import annotations

from typing import Any

from lmrl.data.tasks import get_task
from lmrl.eval.metrics import pass_at_k, pass_hat_k

__all__ = ["episode_scores", "pass_at_k", "pass_hat_k"]


def episode_scores(batch, rows: list[dict[str, Any]]) -> list[float]:
    """Task score of each trajectory's final answer (rows repeated per trajectory)."""
    return [get_task(r["task"]).score(answer, r["answer"], r["meta"]) for r, answer in zip(rows, batch.completions)]
