"""Reward models: Bradley-Terry (pairs, margin, K-wise), Plackett-Luce, outcome (ORM) and process (PRM) RMs.

RLHF book ch. 5 (`spec/rlhf-book-core.md` §3). A reward model is the causal LM plus a linear head
(`lmrl.models.reward.RewardModel`) scoring prompt and completion jointly at the last real token:
  bt             −log σ(r_c − r_r [− m]) for K = 2 (m: the Llama 2 margin, `margin=true`); for K > 2 the
                 mean over all C(K,2) pairs of a prompt, which are always in the same batch (InstructGPT);
  plackett_luce  NLL of the whole ranking of K completions (Starling; = bt for K = 2);
  orm            per-token BCE against the outcome label on every completion token (Cobbe et al. 2021);
  prm            3-class cross-entropy (−1/0/+1) at the token that ends each step (Lightman et al. 2023).
Held-out pairwise accuracy (fraction of ranked pairs the RM orders correctly) is `eval/accuracy`;
for ORM/PRM it is the token/step classification accuracy.

Deviations: the ORM head is a plain linear head trained without Cobbe et al.'s auxiliary LM loss (as in
"Let's Verify"); the default data is the built-in arithmetic preferences (`builtin:prefs`), whose labels
come from a hidden gold score, so accuracy is exact.

Launch::

    lmrl reward --config reward/tiny_prefs                          # built-in data, CPU, ~2 min
    lmrl reward model=runs/sft/final dataset=prefs.jsonl batch_size=64 lr=1e-5 max_steps=1000
    lmrl reward mode=score model=runs/reward/final dataset=pairs.jsonl   # writes scores.jsonl

The config is `reward_config.py`; ``mode=score`` (scoring a file with a trained RM) is `reward_score.py`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch
from rich.markup import escape

from lmrl.algorithms import REWARD_MODEL_LOSSES, reward_model_loss
from lmrl.data import packing
from lmrl.data import preference as prefs
from lmrl.data.chat import IGNORE_INDEX
from lmrl.models import autocast, describe_parameters
from lmrl.models.placement import model_device, to_device
from lmrl.models.reward import RewardModel
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.rewards.reward_model import score_texts
from lmrl.tracking import console
from lmrl.trainers import common, loop
from lmrl.trainers.reward import score as reward_score
from lmrl.trainers.reward.config import RewardConfig  # also `lmrl reward`'s config (lmrl/cli.py)


def trait(config: RewardConfig, key: str):
    """What the configured loss declares (`lmrl.algorithms.reward_model`): its data, head, margin, listwise."""
    return REWARD_MODEL_LOSSES.trait(config.loss, key, None)


@dataclasses.dataclass(frozen=True)
class Item:
    """One training unit: K sequences best first (bt/PL), or one sequence with per-token labels (orm/prm)."""

    seqs: tuple[prefs.Tokenized, ...]
    margin: float | None = None
    labels: tuple[tuple[int, int], ...] = ()  # (completion position, class label) for orm/prm


# ----------------------------------------------------------------------------- data


def build_items(rows: list[dict], tokenizer, config: RewardConfig, where: str) -> tuple[list[Item], list, int]:
    """Validated, tokenized items of `rows`, their parsed records, and how many were dropped as overlong."""
    tok = lambda p, c, w: prefs.tokenize(tokenizer, p, c, config.chat, w)  # noqa: E731
    items: list[Item] = []
    if trait(config, "data") == "labelled":
        records = prefs.parse_labelled_rows(rows, where)
        for r in records:
            t = tok(r.prompt, r.completion, r.where)
            items.append(Item((t,), labels=tuple((j, r.label) for j, m in enumerate(t.learn) if m)))
    elif trait(config, "data") == "steps":
        records = prefs.parse_step_rows(rows, where)
        for r in records:
            t = tok(r.prompt, r.completion, r.where)
            positions = prefs.step_positions(tokenizer, t, r.steps, r.where)
            items.append(Item((t,), labels=tuple((p, y + 1) for p, y in zip(positions, r.label))))  # -1/0/+1 -> 0/1/2
    else:
        records = prefs.parse_preference_rows(rows, where)
        check_groups(records, config, where)
        items = [Item(tuple(tok(g.prompt, c, g.where) for c in g.completions), g.margin) for g in records]
    keep = [max(len(s) for s in item.seqs) <= config.max_length for item in items]
    dropped = keep.count(False)
    if dropped and config.overlong == "error":
        raise ValueError(
            f"{where}: {dropped} of {len(items)} rows are longer than max_length={config.max_length} "
            "tokens. Raise max_length or set overlong=drop."
        )
    if not any(keep):
        raise ValueError(
            f"{where}: all {len(items)} rows are longer than max_length={config.max_length}. Raise max_length."
        )
    return [i for i, k in zip(items, keep) if k], [r for r, k in zip(records, keep) if k], dropped


def check_groups(groups: list[prefs.PreferenceGroup], config: RewardConfig, where: str) -> None:
    """One K for the whole dataset (batches are B x K), and margins where margin=true needs them."""
    k = groups[0].k
    other = next((g for g in groups if g.k != k), None)
    if other is not None:
        raise ValueError(
            f"{other.where}: has {other.k} completions but {groups[0].where} has {k}; every row needs "
            "the same number K (a batch is B prompts x K). Split the file by K."
        )
    if (config.margin or config.center_coef) and k > 2:
        raise ValueError(f"{where}: margin and center_coef apply to pairs (K = 2), but rows have K = {k}.")
    missing = next((g for g in groups if g.margin is None), None)
    if config.margin and missing is not None:
        raise ValueError(f"{missing.where}: margin=true needs a `margin` column or chosen_score/rejected_score.")


def load_data(config: RewardConfig, tokenizer):
    rows = prefs.load_preference_rows(config.dataset, config.split, config.train_rows, **config.data_args)
    items, _, dropped = build_items(rows, tokenizer, config, config.dataset)
    budget = config.max_tokens_per_microbatch
    longest = max(sum(len(s) for s in item.seqs) for item in items)
    if budget is not None and longest > budget:
        raise ValueError(
            f"{config.dataset}: a prompt's {len(items[0].seqs)} sequences take {longest} tokens, more "
            f"than max_tokens_per_microbatch={budget} (a prompt's completions are packed together). "
            f"Raise it to at least {longest}."
        )
    eval_source = config.eval_dataset or (config.dataset if config.dataset in prefs.BUILTIN_SOURCES else None)
    eval_items, eval_records = [], []
    if eval_source:
        eval_args = config.data_args if eval_source in prefs.BUILTIN_SOURCES else {}
        eval_rows = prefs.load_preference_rows(eval_source, config.eval_split, config.eval_rows, **eval_args)
        eval_items, eval_records, _ = build_items(eval_rows, tokenizer, config, eval_source)
    return items, eval_items, eval_records, dropped


# ----------------------------------------------------------------------------- loss


def sequence_batch(seqs: list[prefs.Tokenized], pad_id: int, packed: bool) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The model's inputs for ``seqs`` and where each sequence starts: (row, first position) (N,) each. Padded: one
    right-padded row per sequence; packed: every sequence in one row (`lmrl.data.packing`)."""
    if not packed:
        batch = prefs.collate_sequences(seqs, pad_id)
        return (
            {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]},
            torch.arange(len(seqs)),
            torch.zeros(len(seqs), dtype=torch.long),
        )
    ids = [s.prompt_ids + s.completion_ids for s in seqs]
    batch = packing.pack(ids, ids)
    starts = torch.tensor([0, *[len(x) for x in ids[:-1]]]).cumsum(0)
    return (
        {"input_ids": batch["input_ids"], "attention_mask": None, "position_ids": batch["position_ids"]},
        torch.zeros(len(seqs), dtype=torch.long),
        starts,
    )


def batch_loss(
    model: RewardModel, items: list[Item], config: RewardConfig, pad_id: int, dtype, packed: bool = False
) -> tuple[torch.Tensor, dict]:
    """Mean loss over `items` and its statistics: pair (or token/step) accuracy, mean pair margin. ``packed``: all
    sequences in one packed row (training with `max_tokens_per_microbatch`)."""
    seqs = [s for item in items for s in item.seqs]
    device = model_device(model)
    inputs, rows, starts = sequence_batch(seqs, pad_id, packed)
    inputs = to_device(inputs, device)
    with autocast(device.type, dtype):
        out = model(**inputs)  # (B*K, L, C), packed: (1, sum of lengths, C)
    if trait(config, "data") != "ranked":  # labels at tokens (orm) or steps (prm)
        labels = torch.full(out.shape[:2], IGNORE_INDEX, dtype=torch.long, device=device)  # (rows, L)
        for b, (item, seq) in enumerate(zip(items, seqs)):
            for pos, y in item.labels:
                labels[rows[b], starts[b] + len(seq.prompt_ids) + pos] = y
        binary = out.shape[-1] == 1
        logits = out[..., 0] if binary else out  # (B, L) or (B, L, 3)
        loss = reward_model_loss(config.loss, {"logits": logits, "labels": labels})
        mask = labels != IGNORE_INDEX
        pred = (logits[mask] > 0).long() if binary else logits[mask].argmax(-1)
        return loss, {"accuracy": (pred == labels[mask]).float().mean().item(), "n": int(mask.sum())}
    k = len(items[0].seqs)
    ends = starts + torch.tensor([len(s) - 1 for s in seqs])  # each sequence's last token
    scores = out[rows.to(device), ends.to(device), 0].view(len(items), k)  # (B, K)
    if trait(config, "listwise"):
        loss = reward_model_loss(config.loss, {"scores": scores})
    elif k > 2:
        loss = reward_model_loss("bt_kwise", {"scores": scores})
    else:
        fields = {"chosen_scores": scores[:, 0], "rejected_scores": scores[:, 1]}
        if config.margin:
            fields["margin"] = torch.tensor([item.margin for item in items], device=device)
        loss = reward_model_loss("bt", fields, center_coef=config.center_coef)
    diff = scores[:, :, None] - scores[:, None, :]  # (B, K, K): r_i − r_j, i ranked above j when i < j
    above = torch.ones(k, k, dtype=torch.bool, device=device).triu(1)
    pairs = diff[:, above].detach()  # (B, C(K,2))
    return loss, {"accuracy": (pairs > 0).float().mean().item(), "margin": pairs.mean().item(), "n": len(items)}


def micro_batches(items: list[Item], config: RewardConfig) -> list[tuple[list[Item], int]]:
    """(items, 1) per micro-batch: ``grad_accum`` equal parts, or with ``max_tokens_per_microbatch`` the prompts
    (all K sequences together) packed first-fit-decreasing by tokens. With packing every rank runs as many parts as
    the rank with the most (a repeat that counts 0), since each backward reduces gradients across ranks."""
    if config.max_tokens_per_microbatch is None:
        micro = len(items) // config.grad_accum
        return [(items[i * micro : (i + 1) * micro], 1) for i in range(config.grad_accum)]
    lengths = [sum(len(s) for s in item.seqs) for item in items]
    parts = [
        ([items[i] for i in b], 1) for b in packing.first_fit_decreasing(lengths, config.max_tokens_per_microbatch)
    ]
    return parts + [(parts[0][0], 0)] * runtime.parts_behind(len(parts))


def item_weight(item: Item, config: RewardConfig) -> int:
    """An item's share of the batch loss: one prompt (bt/PL), or its labelled tokens (orm/prm)."""
    return len(item.labels) if trait(config, "data") != "ranked" else 1


def train_step(
    model, items: list[Item], config: RewardConfig, pad_id: int, dtype, step: int, total: int | None = None
) -> dict[str, float]:
    """Forward/backward over grad_accum micro-batches; the loss is the mean over the whole batch
    (over prompts for bt/PL, over labelled tokens for orm/prm), so accumulation is exact. ``total``: the whole
    batch's weight when ``items`` is one process's share of it (default: ``items``' own)."""
    chunks = micro_batches(items, config)
    weights = [sum(item_weight(i, config) for i in c) * counts for c, counts in chunks]
    total = total or sum(weights)
    sums: dict[str, float] = {}
    for (chunk, _), w in zip(chunks, weights):
        loss, stats = batch_loss(model, chunk, config, pad_id, dtype, config.max_tokens_per_microbatch is not None)
        common.check_finite(loss, step)
        (loss * w / total).backward()
        named = {"loss": loss.item(), **{f"policy/{k}": v for k, v in stats.items() if k != "n"}}
        for key, value in named.items():
            sums[key] = sums.get(key, 0.0) + value * w / total
    return sums


@torch.no_grad()
def evaluate(
    model, items: list[Item], config: RewardConfig, pad_id: int, dtype, batch_size: int = 64
) -> dict[str, float]:
    if not items:
        return {}
    was_training = model.training
    model.eval()
    sums, total = {}, 0
    for start in range(0, len(items), batch_size):
        loss, stats = batch_loss(model, items[start : start + batch_size], config, pad_id, dtype)
        n = stats.pop("n")
        total += n
        for key, value in {"loss": loss.item(), **stats}.items():
            sums[key] = sums.get(key, 0.0) + value * n
    model.train(was_training)
    return {f"eval/{k}": v / total for k, v in sums.items()}


def eval_samples(model, tokenizer, records, config: RewardConfig, dtype) -> list[dict[str, Any]]:
    """A few held-out rows with the RM's score of each completion (best and worst of a ranking)."""
    rows = []
    for r in records[: config.num_samples]:
        if isinstance(r, prefs.PreferenceGroup):
            best, worst = r.completions[0], r.completions[-1]
            s_best, s_worst = score_texts(model, tokenizer, [r.prompt] * 2, [best, worst], dtype=dtype)
            rows.append(
                {
                    "prompt": str(r.prompt)[-60:],
                    "chosen": str(best),
                    "rejected": str(worst),
                    "reward_chosen": s_best,
                    "reward_rejected": s_worst,
                }
            )
        else:
            (score,) = score_texts(model, tokenizer, [r.prompt], [r.completion], dtype=dtype)
            rows.append(
                {"prompt": str(r.prompt)[-60:], "completion": str(r.completion), "label": str(r.label), "score": score}
            )
    return rows


# ----------------------------------------------------------------------------- the method


class RewardModelTraining(loop.MethodDefaults):
    """The reward-model method for `loop.run`: one step is one optimizer step on ``batch_size`` prompts (each with
    all its K completions; orm/prm: ``batch_size`` labelled completions)."""

    samples_title = "held-out rows"
    data_parallel = True

    def __init__(self, config: RewardConfig, setup: ModelSetup):
        self.config, self.setup = config, setup
        lm, self.tokenizer = setup.policy(distribute=False)
        if config.max_tokens_per_microbatch:
            packing.check_packable(lm, len(self.tokenizer))
        # several processes: the head is sharded (or replicated) with the backbone, as one module
        self.model = setup.distribute(RewardModel(lm, trait(config, "head"), chat=config.chat, seed=config.seed))
        self.model.train()
        self.items, self.eval_items, self.eval_records, self.dropped = load_data(config, self.tokenizer)
        self.optimizer = common.build_optimizer(self.model, config)
        self.scheduler = common.build_scheduler(self.optimizer, config)

    def step(self, step: int) -> dict[str, float]:
        config, t0 = self.config, time.perf_counter()
        idx = common.epoch_batch_indices(len(self.items), config.batch_size, step, config.seed)
        batch = [self.items[i] for i in idx]
        total = sum(item_weight(item, config) for item in batch)
        shard = runtime.shard(batch)  # this process's equal share (all of it with one process)
        stats = train_step(self.model, shard, config, self.tokenizer.pad_token_id, self.setup.dtype, step, total)
        tokens = sum(len(s) for item in shard for s in item.seqs)
        # each rank's stats are its part of the batch mean: world x part, averaged over the ranks, is the mean
        stats = {key: value * runtime.world() for key, value in stats.items()}
        return {**stats, **common.finish_step(self, step, t0, tokens)}

    def describe(self, run: common.Run) -> str:
        return (
            f"Reward model ({self.config.loss}): {describe_parameters(self.model)}, {len(self.items)} training "
            f"rows ({self.dropped} dropped as overlong), {len(self.eval_items)} held-out, "
            f"precision={self.setup.precision_name}, run dir {run.dir}"
        )

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict]]:
        dtype = self.setup.dtype
        metrics = evaluate(self.model, self.eval_items, self.config, self.tokenizer.pad_token_id, dtype)
        return metrics, eval_samples(self.model, self.tokenizer, self.eval_records, self.config, dtype)


# ----------------------------------------------------------------------------- entry points


def train(config: RewardConfig) -> dict[str, float]:
    """Train a reward model end to end (or score a dataset with mode=score); returns the final metrics."""
    if config.mode == "score":
        return reward_score.score(config)
    result = loop.train(RewardModelTraining, config, f"reward ({config.loss})")
    final_dir = Path(config.output_dir).expanduser() / "final"
    console.print(
        escape(
            f"Reward model: {final_dir} (load with lmrl.models.reward.load_reward_model; use in RL "
            f"as rewards=[model:{final_dir}])"
        )
    )
    return result
