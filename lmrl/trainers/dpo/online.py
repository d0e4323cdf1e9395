"""Online DPO: preference pairs sampled from the current policy and labelled every step (`lmrl dpo online=true`).

RLHF book ch. 8 "online / iterative" (spec `rlhf-book-advanced.md` §1: current-policy pairs labelled by an AI
judge; D2PO relabels with a reward model), with any DPO-family loss of `lmrl.algorithms.PREFERENCE_LOSSES`:
1. take `batch_size` prompts and sample K = `samples_per_prompt` completions each from the CURRENT policy
   (`temperature`, `top_p`, `top_k`, seeded per step, so a resumed run samples the same);
2. label: the weighted sum of `rewards` (a verifier such as `task` or `gold`, `model:PATH` reward models, the
   `judge`/`rubric` rewards, user functions) picks chosen = argmax, rejected = argmin of the K samples; a prompt
   whose best and worst differ by <= `min_gap` is a tie and is skipped (counted). With `judge=PATH` a pairwise
   LLM judge compares the K = 2 samples in both orders instead (`lmrl.rewards.judge`): a tie or a failed
   verdict skips the prompt (both counted); `rewards`, if given, are then only logged. A failing reward
   function skips the step (`on_reward_error=skip`, counted in `reward/errors`) or stops the run (`stop`);
3. one optimizer step of the loss on the kept pairs against π_ref = the initial policy (a frozen copy; or
   `ref_model`), whose log-probs are computed on the fly (new pairs every step, so nothing can be cached).

Logged: the label source's scores (`reward/mean`, `reward/<fn>/mean`, `label/chosen_score`,
`label/rejected_score`, `label/gap`), `label/pairs`, `label/tie_frac`, judge failures, the usual DPO metrics
(`loss`, `policy/logp_*`, implicit `policy/reward_*`) and held-out evals (gold score on
`builtin:prefs`, `eval/accuracy` on built-in task prompts).

Deviations: KTO (unpaired) is not offered online; ODPO's offset uses the label rewards of the pair. The offline
fields `precompute_ref`, `ranking_pairs`, `max_length` and `overlong` apply to held-out pairs only.

Launch::

    lmrl dpo --config dpo/online_tiny_prefs                       # CPU, built-in model and data, gold-score labels
    lmrl dpo --config dpo/online_tiny_prefs nproc=2               # two processes, each labelling half the prompts
    lmrl dpo online=true model=runs/sft/final dataset=prompts.jsonl rewards=[model:runs/reward/final] beta=0.1
    lmrl dpo online=true model=runs/sft/final dataset=prompts.jsonl judge=Qwen/Qwen2.5-7B-Instruct
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from lmrl.algorithms import RunningDelta
from lmrl.data import packing
from lmrl.data import preference as prefs
from lmrl.data.chat import encode_prompt
from lmrl.data.loading import is_generated
from lmrl.data.prompt_format import PromptFormat
from lmrl.eval.generation import task_accuracy
from lmrl.models import describe_parameters
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.rewards import RewardFailure, RewardSet
from lmrl.rewards.judge import PairwiseJudge
from lmrl.rollout.engines.factory import make_engine
from lmrl.rollout.protocol import Engine
from lmrl.rollout.samplers.groups import sampling_params, seeded_shards
from lmrl.rollout.types import RolloutBatch, concat_batches
from lmrl.trainers import common, loop
from lmrl.trainers.dpo.common import Example, Reference, build_examples, evaluate, reference_logps, train_step
from lmrl.trainers.dpo.config import DPOConfig

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
    pairs = [
        (i, 2 * i, 2 * i + 1) if v == "A" else (i, 2 * i + 1, 2 * i) for i, v in enumerate(verdicts) if v in ("A", "B")
    ]
    return pairs, sum(v == "tie" for v in verdicts), sum(v is None for v in verdicts)


# ----------------------------------------------------------------------------- one step


@dataclasses.dataclass
class OnlineDPOParts:
    """The live objects of a run that a step uses."""

    model: Any
    tokenizer: Any
    ref_model: Any  # frozen π_ref, None for reference-free losses
    engine: Engine  # lmrl.rollout.engines.factory.make_engine
    reward_set: RewardSet | None
    judge: PairwiseJudge | None
    optimizer: torch.optim.Optimizer
    scheduler: Any


def sample(
    parts: OnlineDPOParts, rows: list[dict], config: DPOConfig, step: int
) -> tuple[RolloutBatch, list[list[int]]]:
    """K completions per prompt from the current policy (prompt-major), and the prompts' token ids. Sampled in this
    rank's seeded ``sampling_shards`` (`lmrl.parallel.shards`): resume-exact and independent of the process count."""
    ids = [encode_prompt(parts.tokenizer, r["prompt"], config.chat) for r in rows]  # as offline DPO tokenizes
    params, k = sampling_params(config), config.samples_per_prompt
    parts.engine.sync(parts.model, step - 1)  # the weights after step - 1 updates (resumed: the restored ones)
    with runtime.full_params(parts.model):  # FSDP: each rank samples with the whole policy, no lockstep
        batches = [
            parts.engine.generate(part, params, n=k, generator=generator)
            for _, part, generator in seeded_shards(ids, config.sampling_shards, config.seed, step, parts.engine.device)
        ]
    return concat_batches(batches, parts.tokenizer.pad_token_id), ids


def label(parts: OnlineDPOParts, batch: RolloutBatch, rows: list[dict], config: DPOConfig):
    """(prompt, chosen row, rejected row) triples, the label scores (N,) or None, and the label metrics."""
    k, metrics = config.samples_per_prompt, {}
    scores = None
    if parts.reward_set is not None:
        columns = {key: [r.get(key) for r in rows for _ in range(k)] for key in rows[0] if key != "prompt"}
        prompts = [r["prompt"] for r in rows for _ in range(k)]
        scores, _, reward_metrics = parts.reward_set.compute(
            prompts,
            batch.completions,
            truncated=batch.truncated.tolist(),
            completion_lengths=batch.completion_lengths.tolist(),
            **columns,
        )
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
    metrics.update(
        {
            "label/pairs": float(len(pairs)),
            "label/tie_frac": ties / len(rows),
            "label/skipped_frac": (ties + failed) / len(rows),
        }
    )
    if scores is not None and pairs:
        c = torch.stack([scores[p[1]] for p in pairs])  # (P,)
        r = torch.stack([scores[p[2]] for p in pairs])  # (P,)
        metrics.update(
            {
                "label/chosen_score": c.mean().item(),
                "label/rejected_score": r.mean().item(),
                "label/gap": (c - r).mean().item(),
            }
        )
    return pairs, scores, metrics


def global_label_metrics(metrics: dict[str, float], pairs: int, total: int, scored: bool) -> dict[str, float]:
    """This rank's pair count and pair-score means (``scored``: labelled by rewards) as its part of the step's
    count and means over every rank's ``total`` pairs, times the world size (so their mean over ranks is exact)."""
    world, share = runtime.world(), pairs * runtime.world() / max(1, total)
    out = {"label/pairs": float(pairs * world)}
    if scored and total:  # a rank without pairs of its own adds 0
        out.update(
            {key: metrics.get(key, 0.0) * share for key in ("label/chosen_score", "label/rejected_score", "label/gap")}
        )
    return out


def to_examples(batch: RolloutBatch, prompt_ids: list[list[int]], pairs, scores, k: int) -> list[Example]:
    """Pairs as `Example`s of the exact sampled tokens (completion up to and including its stop token)."""
    lengths = batch.completion_lengths.tolist()

    def seq(row: int) -> prefs.Tokenized:
        completion = tuple(batch.completion_ids[row, : lengths[row]].tolist())
        return prefs.Tokenized(tuple(prompt_ids[row // k]), completion, (1,) * len(completion))

    return [
        Example((seq(c), seq(r)), scores=None if scores is None else (float(scores[c]), float(scores[r])))
        for _, c, r in pairs
    ]


def online_step(
    parts: OnlineDPOParts, rows: list[dict], config: DPOConfig, dtype, step: int, delta: RunningDelta, tracker
) -> dict[str, float]:
    """Sample, label, and one DPO-family optimizer step on the kept pairs; returns the step's metrics."""
    t0 = time.perf_counter()
    batch, prompt_ids = sample(parts, rows, config, step)
    t1 = time.perf_counter()
    with RewardFailure() as failure:
        pairs, scores, metrics = label(parts, batch, rows, config)
    if failure.skips(tracker, step):
        return failure.skipped(parts.reward_set.errors)
    t2 = time.perf_counter()
    metrics.update(
        {
            "completion_len/mean": batch.completion_lengths.float().mean().item(),
            "rollout/truncated_frac": batch.truncated.float().mean().item(),
            "time/rollout_s": t1 - t0,
            "time/label_s": t2 - t1,
            "lr": parts.scheduler.get_last_lr()[0],
        }
    )
    if step % max(1, config.log_every) == 0 or step == 1:
        tracker.log_samples(
            step,
            [
                {
                    "prompt": rows[i]["prompt"],
                    "chosen": batch.completions[c],
                    "rejected": batch.completions[r],
                    **(
                        {} if scores is None else {"chosen_score": scores[c].item(), "rejected_score": scores[r].item()}
                    ),
                }
                for i, c, r in pairs[: config.num_samples]
            ],
            "online pairs",
        )
    total, most = int(runtime.all_sum(len(pairs))), int(runtime.all_max(len(pairs)))  # kept pairs over ranks
    metrics.update(global_label_metrics(metrics, len(pairs), total, scores is not None))
    if not total:  # every prompt tied or failed: nothing to learn from this step
        return metrics
    k, pad_id = config.samples_per_prompt, parts.tokenizer.pad_token_id
    examples = to_examples(batch, prompt_ids, pairs, scores, k)
    # every rank forwards `most` pairs (FSDP/DDP run collectives in each forward and backward): the pads after this
    # rank's pairs repeat a sampled pair with loss weight 0
    examples += to_examples(batch, prompt_ids, [(0, 0, 1)], scores, k) * (most - len(pairs))
    ref = (
        reference_logps(parts.ref_model, examples, pad_id, dtype, chunk_mb=config.logprob_chunk_mb)
        if parts.ref_model is not None
        else None
    )
    stats = train_step(parts.model, examples, ref, config, pad_id, dtype, step, delta, total, len(pairs))
    grad_norm = common.optimizer_step(parts.model, parts.optimizer, parts.scheduler, config.max_grad_norm, step)
    metrics.update(
        {
            **stats,
            "optim/grad_norm": grad_norm,
            "time/train_s": time.perf_counter() - t2,
            "tokens_per_s": batch.completion_mask.sum().item() / (t1 - t0),
        }
    )
    return metrics


# ----------------------------------------------------------------------------- data and evaluation


def load_online_data(config: DPOConfig, tokenizer) -> tuple[list[dict], list[Example], list[dict], list[dict]]:
    """Training prompt rows; held-out pairs (pair data only), gold-score rows (`builtin:prefs`) and task rows."""
    rows = prefs.load_preference_rows(config.dataset, config.split, config.train_rows, **config.data_args)
    if not rows or "prompt" not in rows[0]:
        found = sorted(rows[0]) if rows else "no rows"
        raise ValueError(
            f"{config.dataset}: online DPO samples its own completions and needs a 'prompt' column; "
            f"found {found}. Messages-style pair data has no prompt column: add one."
        )
    builtin = config.dataset in prefs.BUILTIN_SOURCES or is_generated(config.dataset)
    source = config.eval_dataset or (config.dataset if builtin else None)
    if not source:
        return rows, [], [], []
    eval_rows = prefs.load_preference_rows(source, config.eval_split, config.eval_rows, **config.data_args)
    paired = bool(eval_rows) and ("chosen" in eval_rows[0] or "completions" in eval_rows[0])
    eval_examples = build_examples(eval_rows, tokenizer, config, source)[0] if paired else []
    gold_rows = eval_rows if source == "builtin:prefs" else []
    task_rows = eval_rows if eval_rows and {"task", "answer", "meta"} <= set(eval_rows[0]) else []
    return rows, eval_examples, gold_rows, task_rows


def evaluate_online(
    parts: OnlineDPOParts, data, config: DPOConfig, dtype, delta: RunningDelta
) -> tuple[dict[str, float], list[dict]]:
    """Held-out implicit-reward stats and gold score (`dpo_common.evaluate`), plus greedy task accuracy."""
    _, eval_examples, gold_rows, task_rows = data
    ref = Reference(model=parts.ref_model, chunk_mb=config.logprob_chunk_mb)
    metrics, samples = evaluate(parts.model, parts.tokenizer, eval_examples, ref, gold_rows, config, dtype, delta)
    if task_rows:
        acc, task_samples = task_accuracy(
            parts.model,
            parts.tokenizer,
            task_rows,
            config.max_new_tokens,
            dtype,
            num_samples=config.num_samples,
            prompt_format=PromptFormat(config.chat),
        )
        metrics["eval/accuracy"] = acc["accuracy"]
        samples = samples or task_samples
    return metrics, samples


# ----------------------------------------------------------------------------- the method


class OnlineDPO(loop.MethodDefaults):
    """The online DPO method for `loop.run`: one step samples, labels and takes one optimizer step (`online_step`).
    With several processes each rank samples and labels batch_size/world prompts; the loss is the mean over every
    rank's pairs.

    Everything that can fail on bad input is built here, before the run starts: the label rewards, the prompts,
    the policy, π_ref (the initial policy loaded again, frozen; or `ref_model`) and the judge."""

    samples_title = "held-out generations"
    data_parallel = True  # exact for every loss but BCO, whose running δ stays per rank

    def __init__(self, config: DPOConfig, setup: ModelSetup):
        self.config, self.setup = config, setup
        reward_set = RewardSet.from_config(config) if config.rewards else None
        model, self.tokenizer = setup.policy(distribute=False)
        if config.max_tokens_per_microbatch:  # on the plain model, before FSDP/DDP wrap it
            packing.check_packable(model, len(self.tokenizer))
        self.model = setup.distribute(model)
        self.model.train()
        self.data = load_online_data(config, self.tokenizer)
        self.rows = self.data[0]
        ref_model = setup.frozen(config.ref_model, self.tokenizer) if config.uses_reference else None
        judge = None
        if config.judge:
            judge_model, judge_tokenizer = setup.judge(config.judge)
            judge = PairwiseJudge(judge_model, judge_tokenizer, autocast_dtype=setup.dtype, **config.judge_args)
        self.optimizer = common.build_optimizer(self.model, config)
        self.scheduler = common.build_scheduler(self.optimizer, config)
        engine = make_engine(config, self.model, self.tokenizer, setup.dtype, sampling=sampling_params(config))
        self.parts = OnlineDPOParts(
            self.model, self.tokenizer, ref_model, engine, reward_set, judge, self.optimizer, self.scheduler
        )
        self.delta = RunningDelta()  # BCO's running mean of the implicit rewards (the other losses ignore it)

    def step(self, step: int) -> dict[str, float]:
        config = self.config
        rows = [self.rows[i] for i in common.epoch_batch_indices(len(self.rows), config.batch_size, step, config.seed)]
        rows = runtime.shard(rows)  # this rank's share of the step's prompts
        return online_step(self.parts, rows, config, self.setup.dtype, step, self.delta, self.tracker)

    def close(self) -> None:
        self.parts.engine.close()

    def describe(self, run: common.Run) -> str:
        config = self.config
        labeller = f"judge {config.judge}" if config.judge else f"rewards {config.rewards}"
        return (
            f"online {config.loss}: {describe_parameters(self.model)}, {len(self.rows)} prompts, "
            f"{config.batch_size}x{config.samples_per_prompt} samples/step labelled by {labeller}, "
            f"precision={self.setup.precision_name}, run dir {run.dir}"
        )

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict]]:
        return evaluate_online(self.parts, self.data, self.config, self.setup.dtype, self.delta)

    def state_dict(self) -> dict[str, Any]:
        return {"bco": self.delta.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.delta = RunningDelta(*state["bco"])


def train(config: DPOConfig) -> dict[str, float]:
    """Run online DPO end to end; returns the final evaluation metrics (plus `initial/...` ones)."""
    return loop.train(OnlineDPO, config, f"online dpo ({config.loss})")
