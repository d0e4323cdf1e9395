"""Multi-turn (tool-use) rollouts for online RL: what `lmrl rl tools=[...]` / `env=...` changes in a step.

The policy-gradient step is the single-turn one (`lmrl.trainers.rl.trainer`): a trajectory is one row of the
`RolloutBatch` whose `loss_mask` leaves out tool outputs, so advantages, losses, KL and TIS apply
unchanged. The episodes are sampled by `lmrl.rollout.samplers.episodes.EpisodeGroups` (the run's group sampler);
this module adds the `env_reward` column for the `env` reward, the `rollout/tools/*` and `rollout/*` episode
metrics, what samples.jsonl keeps of an episode, and the held-out evaluation of tool episodes.
"""

from __future__ import annotations

from typing import Any

import torch

from lmrl.eval.runner import EvalOptions, Evaluator
from lmrl.parallel import runtime
from lmrl.rollout.types import RolloutBatch


def episode_columns(batch: RolloutBatch) -> dict[str, list]:
    """Extra reward columns of multi-turn rows: `env_reward` (the `env` reward reads it)."""
    return {"env_reward": [info["env_reward"] for info in batch.info]} if batch.info is not None else {}


def episode_metrics(batch: RolloutBatch) -> dict[str, float]:
    """rollout/tools/* (per episode), rollout/<finish>_frac, rollout/turns_mean and rollout/trained_tokens_frac of a
    multi-turn batch; {} for single-turn. Several processes: every rank calls it (ranks have equal numbers of
    episodes, so per-episode means average over ranks exactly)."""
    if batch.info is None:
        return {}
    n = len(batch.info)
    metrics: dict[str, float] = {}
    keys = sorted({k for info in batch.info for k in info["stats"]})
    for key in keys:
        metrics[f"rollout/tools/{key}_per_episode"] = sum(info["stats"].get(key, 0) for info in batch.info) / n
    for finish in ("done", "max_turns", "turn_length", "budget"):
        metrics[f"rollout/{finish}_frac"] = sum(info["finish"] == finish for info in batch.info) / n
    metrics["rollout/turns_mean"] = sum(info["num_turns"] for info in batch.info) / n
    # over every rank's tokens (each rank reports the global share; the metrics' mean over ranks keeps it)
    trained, total = runtime.all_sum(torch.stack([batch.train_mask.sum(), batch.completion_mask.sum()]).float())
    metrics["rollout/trained_tokens_frac"] = float(trained / total.clamp(min=1))
    return metrics


def sample_fields(batch: RolloutBatch, i: int) -> dict[str, Any]:
    """What samples.jsonl keeps of row i. Single-turn: the prompt's last 60 characters and the completion. A
    multi-turn row, losslessly: the whole prompt, the transcript as `completion`, the conversation (`messages`),
    the assistant turns' token spans (`turns`) and `token_roles`, the completion's tokens run-length encoded as
    [role, loss mask, count] (``["assistant", 1, 12], ["tool", 0, 9], ...``; sums to the completion's length)."""
    if batch.info is None:
        return {"prompt": batch.prompts[i][-60:], "completion": batch.completions[i]}
    info = batch.info[i]
    return {
        "prompt": batch.prompts[i],
        "completion": info["transcript"],
        "messages": info["messages"],
        "turns": [list(span) for span in info["turns"]],
        "token_roles": token_roles(batch, i),
    }


def token_roles(batch: RolloutBatch, i: int) -> list[list]:
    """Run-length [role, loss mask, count] of multi-turn row i's completion tokens: ``assistant`` on sampled turns,
    the environment messages' role (``tool``, ``user``) between them."""
    info = batch.info[i]
    length = int(batch.completion_mask[i].sum())
    roles = ["assistant"] * length
    for role, start, end in info["env_spans"]:
        roles[start:end] = [role] * (min(end, length) - start)
    mask = batch.train_mask[i, :length].round().int().tolist()
    runs: list[list] = []
    for role, m in zip(roles, mask):
        if runs and runs[-1][0] == role and runs[-1][1] == m:
            runs[-1][2] += 1
        else:
            runs.append([role, m, 1])
    return runs


def evaluate_episodes(
    model, tokenizer, eval_rows: list[dict[str, Any]], config, dtype, env_factory, max_new_tokens: int | None = None
):
    """Greedy held-out accuracy of tool episodes (eval/accuracy) and their tool metrics: `lmrl eval
    metrics=[accuracy]` with the run's tool keys, on the same evaluator (so the two agree exactly)."""
    options = EvalOptions(max_new_tokens=max_new_tokens or config.max_new_tokens, num_samples=config.num_samples)
    evaluator = Evaluator(["accuracy"], eval_rows, options, "eval rows", turns=config.turn_options())
    metrics, samples = evaluator(model, tokenizer, dtype, env_factory=env_factory)
    return {
        "eval/accuracy": metrics["accuracy"],
        "eval/tool_calls_per_episode": metrics.get("tools/calls_per_episode", 0.0),
    }, samples
