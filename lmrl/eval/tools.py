"""Evaluation of tool-use episodes: accuracy of the final answers, pass@k and τ-bench pass^k.

pass@k is the chance that at least one of k trials succeeds; pass^k (τ-bench, Yao et al. 2024) the chance
that all k succeed, which measures reliability. From n >= k trials of which c succeed, both are estimated
without bias (Chen et al. 2021 for pass@k):

    pass@k = 1 - C(n-c, k) / C(n, k)        pass^k = C(c, k) / C(n, k)      (`lmrl.eval.metrics`)
"""

from __future__ import annotations

from typing import Any

import torch

from lmrl.data.tasks import get_task
from lmrl.eval.metrics import pass_at_k, pass_hat_k
from lmrl.rollout.multiturn import MultiTurnOptions, run_episodes
from lmrl.rollout.types import SamplingParams


def episode_scores(batch, rows: list[dict[str, Any]]) -> list[float]:
    """Task score of each trajectory's final answer (rows repeated per trajectory)."""
    return [get_task(r["task"]).score(answer, r["answer"], r["meta"]) for r, answer in zip(rows, batch.completions)]


def tool_eval(engine, tokenizer, rows: list[dict[str, Any]], env_factory, options: MultiTurnOptions,
              max_new_tokens: int, n: int = 1, ks: tuple[int, ...] = (1,), temperature: float = 1.0,
              seed: int = 0, batch_size: int = 32, num_samples: int = 4) -> tuple[dict[str, float], list[dict]]:
    """Run n episodes per built-in task row (n=1: greedy) and score them.

    Returns {"accuracy", "pass@k", "pass^k" for k in ks, "tools/calls_per_episode", "tools/call_errors_per_episode"}
    and the first `num_samples` transcripts."""
    greedy = n == 1
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=greedy, temperature=1.0 if greedy else temperature)
    generator = torch.Generator().manual_seed(seed)
    successes, calls, errors, samples = [], 0, 0, []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        rep = [r for r in chunk for _ in range(n)]
        batch = run_episodes(engine, tokenizer, [env_factory(r) for r in rep], rep, params, options, generator, n)
        scores = episode_scores(batch, rep)
        for i in range(len(chunk)):
            successes.append(int(sum(scores[i * n : (i + 1) * n])))
        for i, info in enumerate(batch.info):
            calls += info["stats"].get("calls", 0)
            errors += info["stats"].get("call_errors", 0)
            if len(samples) < num_samples and i % n == 0:
                samples.append({"prompt": rep[i]["prompt"], "completion": info["transcript"], "answer": rep[i]["answer"],
                                "score": scores[i]})
    episodes = len(rows) * n
    metrics = {"accuracy": sum(successes) / episodes, "tools/calls_per_episode": calls / episodes,
               "tools/call_errors_per_episode": errors / episodes}
    for k in ks:
        if k <= n:
            metrics[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in successes) / len(successes)
            metrics[f"pass^{k}"] = sum(pass_hat_k(n, c, k) for c in successes) / len(successes)
    return metrics, samples
