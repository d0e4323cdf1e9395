"""Online DPO: preference pairs sampled from the current policy and labelled every step (`lmrl dpo online=true`).

RLHF book ch. 8 "online / iterative" (spec `rlhf-book-advanced.md` §1: current-policy pairs labelled by an AI
judge; D2PO relabels with a reward model), with any DPO-family loss of `lmrl.algorithms.PREFERENCE_LOSSES`:
1. take `batch_size` prompts and sample K = `samples_per_prompt` completions each from the CURRENT policy
   (temperature `temperature`, seeded per step, so a resumed run samples the same);
2. label: the weighted sum of `rewards` (a verifier such as `task` or `gold`, `model:PATH` reward models, the
   `judge`/`rubric` rewards, user functions) picks chosen = argmax, rejected = argmin of the K samples; a prompt
   whose best and worst differ by <= `min_gap` is a tie and is skipped (counted). With `judge=PATH` a pairwise
   LLM judge compares the K = 2 samples in both orders instead (`lmrl.rewards.judge`): a tie or a failed
   verdict skips the prompt (both counted); `rewards`, if given, are then only logged;
3. one optimizer step of the loss on the kept pairs against π_ref = the initial policy (a frozen copy; or
   `ref_model`), whose log-probs are computed on the fly (new pairs every step, so nothing can be cached).

Logged: the label source's scores (`reward/mean`, `rewards/<fn>/mean`, `label/chosen_score`,
`label/rejected_score`, `label/gap`), `label/pairs`, `label/tie_frac`, judge failures, the usual DPO metrics
(`loss`, `logps/*`, implicit `rewards/chosen|rejected|margin|accuracy`) and held-out evals (gold score on
`builtin:prefs`, `eval/accuracy` on built-in task prompts).

Deviations: KTO (unpaired) is not offered online; ODPO's offset uses the label rewards of the pair. The offline
fields `precompute_ref`, `ranking_pairs`, `max_length` and `overlong` apply to held-out pairs only.

Launch::

    lmrl dpo --config dpo/online_tiny_prefs                       # CPU, built-in model and data, gold-score labels
    lmrl dpo online=true model=runs/sft/final dataset=prompts.jsonl rewards=[model:runs/reward/final] beta=0.1
    lmrl dpo online=true model=runs/sft/final dataset=prompts.jsonl judge=Qwen/Qwen2.5-7B-Instruct
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any

import torch

from lmrl.config import ConfigError
from lmrl.data import preference as prefs
from lmrl.data.chat import encode_prompt
from lmrl.eval.generation import task_accuracy
from lmrl.models import autocast_dtype, count_parameters, load_model_and_tokenizer
from lmrl.rewards import RewardError, RewardSet
from lmrl.rewards.judge import PairwiseJudge, load_judge_model
from lmrl.rollout.hf import HFEngine, SamplingParams
from lmrl.rollout.types import RolloutBatch
from lmrl.trainers import common
from lmrl.trainers.preference import (DPOConfig, Example, Reference, build_examples, evaluate, load_reference,
                                      reference_logps, train_step)

ONLINE_LOSSES_EXCLUDED = ("kto",)  # unpaired: online sampling yields pairs


def check_online_config(config: DPOConfig) -> None:
    """Start-up checks of the online fields (called from `DPOConfig.__post_init__` when online=true)."""
    if config.loss in ONLINE_LOSSES_EXCLUDED:
        raise ConfigError(f"online=true does not support loss={config.loss} (it takes unpaired examples); use a "
                          "paired loss such as dpo, ipo or simpo.")
    if config.samples_per_prompt < 2:
        raise ConfigError(f"online=true needs samples_per_prompt >= 2 to form a pair, got {config.samples_per_prompt}.")
    if not config.rewards and not config.judge:
        raise ConfigError("online=true needs a label source: rewards=[...] (e.g. rewards=[gold], rewards=[task], "
                          "rewards=[model:runs/reward/final]) or judge=PATH (a pairwise LLM judge).")
    if config.judge and config.samples_per_prompt != 2:
        raise ConfigError(f"judge=... compares two completions: set samples_per_prompt=2 (got "
                          f"{config.samples_per_prompt}), or label K samples with rewards=[judge] against a reference.")
    if config.judge and config.loss == "odpo":
        raise ConfigError("loss=odpo needs label scores; a pairwise judge gives none. Use rewards=[...] with odpo.")
    if config.reward_weights and len(config.reward_weights) != len(config.rewards):
        raise ConfigError(f"reward_weights has {len(config.reward_weights)} entries for {len(config.rewards)} "
                          f"rewards {config.rewards}; give one weight per reward.")
    if not config.temperature > 0 or config.max_new_tokens < 1:
        raise ConfigError(f"online=true samples: temperature must be > 0 and max_new_tokens >= 1, got "
                          f"{config.temperature} and {config.max_new_tokens}.")
    unknown = set(config.judge_args) - {"swap", "max_new_tokens", "batch_size", "prompt", "chat"}
    if unknown:
        raise ConfigError(f"judge_args: unknown options {sorted(unknown)}; they are swap, max_new_tokens, "
                          "batch_size, prompt, chat.")


# ----------------------------------------------------------------------------- labelling (pure)


def best_worst_pairs(scores: torch.Tensor, group_size: int, min_gap: float = 0.0):
    """Per prompt, the rows of its best and worst sample and whether it is a tie (gap <= min_gap).

    scores: (B*K,) prompt-major. Returns chosen (B,), rejected (B,) row indices into the flat scores (the
    first best/worst on equal scores) and tie (B,) bool.
    """
    if scores.dim() != 1 or scores.numel() % group_size:
        raise ValueError(f"best_worst_pairs: scores must be (B*K,) with K={group_size}, got {tuple(scores.shape)}.")
    s = scores.view(-1, group_size)  # (B, K)
    offset = torch.arange(s.shape[0]) * group_size  # (B,)
    best, worst = s.argmax(dim=1), s.argmin(dim=1)  # (B,) each
    tie = (s.max(dim=1).values - s.min(dim=1).values) <= min_gap  # (B,)
    return offset + best, offset + worst, tie


def judge_pairs(verdicts: list) -> tuple[list[tuple[int, int, int]], int, int]:
    """(prompt i, chosen row, rejected row) per decided verdict of pairs (rows 2i, 2i+1); and the counts of
    ties and failures (None)."""
    pairs = [(i, 2 * i, 2 * i + 1) if v == "A" else (i, 2 * i + 1, 2 * i)
             for i, v in enumerate(verdicts) if v in ("A", "B")]
    return pairs, sum(v == "tie" for v in verdicts), sum(v is None for v in verdicts)


# ----------------------------------------------------------------------------- one step


@dataclasses.dataclass
class Parts:
    """The live objects of a run that a step uses."""

    model: Any
    tokenizer: Any
    ref_model: Any  # frozen π_ref, None for reference-free losses
    engine: HFEngine
    reward_set: RewardSet | None
    judge: PairwiseJudge | None
    optimizer: torch.optim.Optimizer
    scheduler: Any


def sample(parts: Parts, rows: list[dict], config: DPOConfig, step: int) -> tuple[RolloutBatch, list[list[int]]]:
    """K completions per prompt from the current policy (prompt-major), and the prompts' token ids."""
    ids = [encode_prompt(parts.tokenizer, r["prompt"], config.chat) for r in rows]  # as offline DPO tokenizes
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature)
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)  # resume-exact sampling
    return parts.engine.generate(ids, params, n=config.samples_per_prompt, generator=generator), ids


def label(parts: Parts, batch: RolloutBatch, rows: list[dict], config: DPOConfig):
    """(prompt, chosen row, rejected row) triples, the label scores (N,) or None, and the label metrics."""
    k, metrics = config.samples_per_prompt, {}
    scores = None
    if parts.reward_set is not None:
        columns = {key: [r.get(key) for r in rows for _ in range(k)] for key in rows[0] if key != "prompt"}
        prompts = [r["prompt"] for r in rows for _ in range(k)]
        scores, _, reward_metrics = parts.reward_set.compute(
            prompts, batch.completions, truncated=batch.truncated.tolist(),
            completion_lengths=batch.completion_lengths.tolist(), **columns)
        metrics.update(reward_metrics)
    if parts.judge is not None:
        verdicts = parts.judge.judge([r["prompt"] for r in rows], batch.completions[0::2], batch.completions[1::2])
        pairs, ties, failed = judge_pairs(verdicts)
        metrics.update({f"label/judge_{key}": v for key, v in parts.judge.last_stats.items()})
        metrics["label/judge_failures_total"] = float(parts.judge.failures)
    else:
        chosen, rejected, tie = best_worst_pairs(scores, k, config.min_gap)
        pairs = [(i, int(c), int(r)) for i, (c, r, t) in enumerate(zip(chosen, rejected, tie)) if not t]
        ties, failed = int(tie.sum()), 0
    metrics.update({"label/pairs": float(len(pairs)), "label/tie_frac": ties / len(rows),
                    "label/skipped_frac": (ties + failed) / len(rows)})
    if scores is not None and pairs:
        c = torch.stack([scores[p[1]] for p in pairs])  # (P,)
        r = torch.stack([scores[p[2]] for p in pairs])  # (P,)
        metrics.update({"label/chosen_score": c.mean().item(), "label/rejected_score": r.mean().item(),
                        "label/gap": (c - r).mean().item()})
    return pairs, scores, metrics


def to_examples(batch: RolloutBatch, prompt_ids: list[list[int]], pairs, scores, k: int) -> list[Example]:
    """Pairs as `Example`s of the exact sampled tokens (completion up to and including its stop token)."""
    lengths = batch.completion_lengths.tolist()

    def seq(row: int) -> prefs.Tokenized:
        completion = tuple(batch.completion_ids[row, : lengths[row]].tolist())
        return prefs.Tokenized(tuple(prompt_ids[row // k]), completion, (1,) * len(completion))

    return [Example((seq(c), seq(r)), scores=None if scores is None else (float(scores[c]), float(scores[r])))
            for _, c, r in pairs]


def online_step(parts: Parts, rows: list[dict], config: DPOConfig, dtype, step: int, state: dict,
                tracker) -> dict[str, float]:
    """Sample, label, and one DPO-family optimizer step on the kept pairs; returns the step's metrics."""
    t0 = time.perf_counter()
    batch, prompt_ids = sample(parts, rows, config, step)
    t1 = time.perf_counter()
    try:
        pairs, scores, metrics = label(parts, batch, rows, config)
    except RewardError as exc:
        if not exc.skippable:
            raise
        tracker.print(f"[yellow]step {step} skipped: {exc}")
        return {"reward/errors": float(parts.reward_set.errors)}
    t2 = time.perf_counter()
    metrics.update({"completion_len/mean": batch.completion_lengths.float().mean().item(),
                    "completion/truncated_frac": batch.truncated.float().mean().item(),
                    "time/rollout_s": t1 - t0, "time/label_s": t2 - t1, "lr": parts.scheduler.get_last_lr()[0]})
    if step % max(1, config.log_every) == 0 or step == 1:
        tracker.log_samples(step, [{"prompt": rows[i]["prompt"], "chosen": batch.completions[c],
                                    "rejected": batch.completions[r],
                                    **({} if scores is None else {"chosen_score": scores[c].item(),
                                                                  "rejected_score": scores[r].item()})}
                                   for i, c, r in pairs[: config.num_samples]], "online pairs")
    if not pairs:  # every prompt tied or failed: nothing to learn from this step
        return metrics
    examples = to_examples(batch, prompt_ids, pairs, scores, config.samples_per_prompt)
    pad_id = parts.tokenizer.pad_token_id
    ref = reference_logps(parts.ref_model, examples, pad_id, dtype) if parts.ref_model is not None else None
    stats = train_step(parts.model, examples, ref, config, pad_id, dtype, step, state)
    grad_norm = common.optimizer_step(parts.model, parts.optimizer, parts.scheduler, config.max_grad_norm, step)
    metrics.update({**stats, "grad_norm": grad_norm, "time/train_s": time.perf_counter() - t2,
                    "tokens_per_s": batch.completion_mask.sum().item() / (t1 - t0)})
    return metrics


# ----------------------------------------------------------------------------- data and evaluation


def load_online_data(config: DPOConfig, tokenizer) -> tuple[list[dict], list[Example], list[dict], list[dict]]:
    """Training prompt rows; held-out pairs (pair data only), gold-score rows (`builtin:prefs`) and task rows."""
    rows = prefs.load_preference_rows(config.dataset, config.split, config.train_rows, **config.data_args)
    if not rows or "prompt" not in rows[0]:
        found = sorted(rows[0]) if rows else "no rows"
        raise ValueError(f"{config.dataset}: online DPO samples its own completions and needs a 'prompt' column; "
                         f"found {found}. Messages-style pair data has no prompt column: add one.")
    builtin = config.dataset in prefs.BUILTIN_SOURCES or config.dataset.startswith("task:")
    source = config.eval_dataset or (config.dataset if builtin else None)
    if not source:
        return rows, [], [], []
    eval_rows = prefs.load_preference_rows(source, config.eval_split, config.eval_rows, **config.data_args)
    paired = bool(eval_rows) and ("chosen" in eval_rows[0] or "completions" in eval_rows[0])
    eval_examples = build_examples(eval_rows, tokenizer, config, source)[0] if paired else []
    gold_rows = eval_rows if source == "builtin:prefs" else []
    task_rows = eval_rows if eval_rows and {"task", "answer", "meta"} <= set(eval_rows[0]) else []
    return rows, eval_examples, gold_rows, task_rows


def evaluate_online(parts: Parts, data, config: DPOConfig, dtype, state) -> tuple[dict[str, float], list[dict]]:
    """Held-out implicit-reward stats and gold score (`preference.evaluate`), plus greedy task accuracy."""
    _, eval_examples, gold_rows, task_rows = data
    ref = Reference(model=parts.ref_model)
    metrics, samples = evaluate(parts.model, parts.tokenizer, eval_examples, ref, gold_rows, config, dtype, state)
    if task_rows:
        acc, task_samples = task_accuracy(parts.model, parts.tokenizer, task_rows, config.max_new_tokens, dtype,
                                          num_samples=config.num_samples)
        metrics["eval/accuracy"] = acc["accuracy"]
        samples = samples or task_samples
    return metrics, samples


def build_parts(config: DPOConfig, model, tokenizer, dtype) -> Parts:
    """π_ref (a frozen copy of the initial policy, made before any checkpoint is restored), labellers, optimizer."""
    ref_model = None
    if config.uses_reference:
        ref_model = load_reference(config, tokenizer) if config.ref_model else copy.deepcopy(model)
        ref_model.eval().requires_grad_(False)
    reward_set = RewardSet(config.rewards, config.reward_weights or None, config.reward_kwargs) \
        if config.rewards else None
    judge = None
    if config.judge:
        judge_model, judge_tokenizer = load_judge_model(config.judge, config.seed)
        judge = PairwiseJudge(judge_model, judge_tokenizer, autocast_dtype=dtype, **config.judge_args)
    optimizer = common.build_optimizer(model, config)
    scheduler = common.build_scheduler(optimizer, config)
    return Parts(model, tokenizer, ref_model, HFEngine(model, tokenizer, autocast_dtype=dtype), reward_set, judge,
                 optimizer, scheduler)


def train_online(config: DPOConfig) -> dict[str, float]:
    """Run online DPO end to end; returns the final evaluation metrics (plus `initial/...` ones)."""
    model, tokenizer = load_model_and_tokenizer(config.model, config.tokenizer, config.seed, config.model_args)
    data = load_online_data(config, tokenizer)
    run = common.start_run(config, f"online dpo ({config.loss})")
    tracker, dtype = run.tracker, autocast_dtype(config.precision)
    parts = build_parts(config, model, tokenizer, dtype)
    labeller = f"judge {config.judge}" if config.judge else f"rewards {config.rewards}"
    tracker.print(f"online {config.loss}: {count_parameters(model) / 1e6:.2f}M params, {len(data[0])} prompts, "
                  f"{config.batch_size}x{config.samples_per_prompt} samples/step labelled by {labeller}, "
                  f"run dir {run.dir}")
    state: dict[str, Any] = {"initial": {}, "bco": (0.0, 0)}
    if run.checkpoint:
        state = common.restore_checkpoint(run.checkpoint, model, parts.optimizer, parts.scheduler)
    else:
        metrics, samples = evaluate_online(parts, data, config, dtype, state)
        state["initial"] = {f"initial/{k}": v for k, v in metrics.items()}
        tracker.log(0, metrics)
        tracker.log_samples(0, samples, "held-out generations")
    model.train()
    rows = data[0]
    try:
        for step in range(run.start_step + 1, config.max_steps + 1):
            batch_rows = [rows[i] for i in common.epoch_batch_indices(len(rows), config.batch_size, step, config.seed)]
            metrics = online_step(parts, batch_rows, config, dtype, step, state, tracker)
            if step % config.log_every == 0 or step == config.max_steps or step == 1:
                tracker.log(step, metrics)
            else:
                tracker.advance(step)
            if common.is_due(step, config.eval_every, config.max_steps):
                metrics, samples = evaluate_online(parts, data, config, dtype, state)
                tracker.log(step, metrics)
                tracker.log_samples(step, samples, "held-out generations")
            if common.is_due(step, config.save_every, config.max_steps):
                common.save_checkpoint(run, step, model, tokenizer, parts.optimizer, parts.scheduler, state,
                                       config.keep_checkpoints)
    except common.TrainingDiverged:
        tracker.close()
        raise
    final, samples = evaluate_online(parts, data, config, dtype, state)
    tracker.log(config.max_steps, final)
    tracker.log_samples(config.max_steps, samples, "held-out generations")
    common.save_checkpoint(run, config.max_steps, model, tokenizer, parts.optimizer, parts.scheduler, state,
                           config.keep_checkpoints)
    final_dir = common.save_final(run, model, tokenizer)
    plots = tracker.close()
    tracker.print(f"Final model: {final_dir}  plots: {run.dir / 'plots'} ({len(plots)} files)")
    return {**state["initial"], **final}
