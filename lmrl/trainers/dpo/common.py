"""What offline DPO (`preference.py`) and online DPO (`online_dpo.py`) share: pairs as `Example`s, summed
completion log-probs of the policy and of π_ref, the DPO-family loss step and the held-out evaluation.

Every loss comes from the registry `lmrl.algorithms.preference_loss(name, batch)`; `train_step` accumulates it over
``grad_accum`` micro-batches and updates BCO's running δ (`lmrl.algorithms.RunningDelta`, saved in checkpoints).
What a loss needs (unpaired examples, scores, δ, a reference) comes from its registry traits, never its name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from lmrl.algorithms import RunningDelta, kto_reference_kl, preference_loss, preference_stats
from lmrl.data import packing
from lmrl.data import preference as prefs
from lmrl.data.prompt_format import PromptFormat
from lmrl.models.forward_plan import ForwardPlan
from lmrl.models.head import DEFAULT_CHUNK_MB
from lmrl.models.logprobs import labelled_logprobs
from lmrl.models.placement import model_device, to_device
from lmrl.parallel import runtime
from lmrl.rollout.engines.hf import HFEngine, SamplingParams
from lmrl.trainers import common
from lmrl.trainers.dpo.config import DPOConfig


@dataclasses.dataclass(frozen=True)
class Example:
    """Two sequences scored together: (chosen, rejected) of a pair, or KTO's (completion, mismatched completion)."""

    seqs: tuple[prefs.Tokenized, prefs.Tokenized]
    label: int = 1  # KTO: 1 desirable, 0 undesirable
    scores: tuple[float, float] | None = None  # ratings of chosen/rejected (ODPO)


def build_examples(rows: list[dict], tokenizer, config: DPOConfig, where: str) -> tuple[list[Example], int]:
    """Tokenized pairs (or KTO examples) of `rows`, dropping overlong ones; errors name the row."""
    tok = lambda p, c, w: prefs.tokenize(tokenizer, p, c, config.chat, w)  # noqa: E731
    if config.unpaired:  # KTO: labelled single completions
        if "label" in rows[0] and "completion" in rows[0]:
            records = [(r.prompt, r.completion, r.label, r.where) for r in prefs.parse_labelled_rows(rows, where)]
        else:
            pairs = prefs.to_pairs(prefs.parse_preference_rows(rows, where), "best_worst")
            records = [(g.prompt, c, label, g.where) for g in pairs for c, label in zip(g.completions, (1, 0))]
        examples, n = [], len(records)
        for i, (prompt, completion, label, w) in enumerate(records):
            # z0's mismatched pair: this prompt with the next example's completion that answers another prompt
            other = next((records[(i + j) % n] for j in range(1, n) if records[(i + j) % n][0] != prompt), None)
            if other is None:
                raise ValueError(f"{where}: KTO needs at least two different prompts (z0 uses mismatched pairs).")
            examples.append(Example((tok(prompt, completion, w), tok(prompt, other[1], w)), label))
    else:
        pairs = prefs.to_pairs(prefs.parse_preference_rows(rows, where), config.ranking_pairs)
        if config.needs_scores and any(g.scores is None for g in pairs):
            bad = next(g for g in pairs if g.scores is None)
            raise ValueError(
                f"{bad.where}: loss={config.loss} needs chosen_score and rejected_score (or ranked `scores`)."
            )
        examples = [
            Example(
                (tok(g.prompt, g.completions[0], g.where), tok(g.prompt, g.completions[1], g.where)), scores=g.scores
            )
            for g in pairs
        ]
    kept = [e for e in examples if max(len(s) for s in e.seqs) <= config.max_length]
    if len(kept) < len(examples) and config.overlong == "error":
        raise ValueError(
            f"{where}: {len(examples) - len(kept)} of {len(examples)} examples are longer than "
            f"max_length={config.max_length} tokens. Raise max_length or set overlong=drop."
        )
    if not kept:
        raise ValueError(f"{where}: every example is longer than max_length={config.max_length}. Raise max_length.")
    return kept, len(examples) - len(kept)


# ----------------------------------------------------------------------------- log-probs


def sequence_logps(
    model, seqs: list[prefs.Tokenized], pad_id: int, dtype, chunk_mb: float = DEFAULT_CHUNK_MB, packed: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs (N,) of each sequence's learned completion tokens, and their counts (N,); ``packed``: the
    sequences in one packed row (`lmrl.data.packing`), summed back per sequence."""
    if packed:
        learned = [
            [-100] * len(s.prompt_ids)
            + [t if keep else -100 for t, keep in zip(s.completion_ids, s.learn, strict=True)]
            for s in seqs
        ]
        batch = to_device(packing.pack([s.prompt_ids + s.completion_ids for s in seqs], learned), model_device(model))
        logp, labelled = labelled_logprobs(model, batch, dtype, chunk_mb)  # (1, L-1)
        rows = batch["row_ids"][0, 1:]
        sums = logp.new_zeros(len(seqs)).index_add(0, rows, logp[0])
        return sums, logp.new_zeros(len(seqs)).index_add(0, rows, labelled[0].to(logp.dtype))
    batch = to_device(prefs.collate_completions(seqs, pad_id), model_device(model))
    logp = ForwardPlan(dtype=dtype, chunk_mb=chunk_mb).logprobs(
        model, batch["input_ids"], batch["attention_mask"], int(batch["completion_start"])
    )  # (N, T)
    mask = batch["completion_mask"]  # (N, T)
    return (logp * mask).sum(dim=1), mask.sum(dim=1)


@torch.no_grad()
def reference_logps(
    model, examples: list[Example], pad_id: int, dtype, batch_size: int = 64, chunk_mb: float = DEFAULT_CHUNK_MB
) -> torch.Tensor:
    """(N, 2) summed reference log-probs of both sequences of every example."""
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        logps, _ = sequence_logps(
            model, [e.seqs[0] for e in chunk] + [e.seqs[1] for e in chunk], pad_id, dtype, chunk_mb
        )
        out.append(logps.view(2, -1).T)  # (b, 2)
    model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, 2)


@dataclasses.dataclass
class Reference:
    """π_ref log-probs (N, 2) of every example: cached tensors, or a frozen model that computes them on demand."""

    train: torch.Tensor | None = None  # (N, 2) of the training examples
    eval: torch.Tensor | None = None  # (M, 2) of the held-out examples
    model: Any = None  # frozen π_ref (precompute_ref=false, online DPO)
    chunk_mb: float = DEFAULT_CHUNK_MB  # the model's LM-head chunk (`logprob_chunk_mb`)

    def logps(self, split: str, indices: Sequence[int], examples: list[Example], pad_id: int, dtype):
        """(b, 2) for `examples` (= rows `indices` of `split`), or None for reference-free losses."""
        if self.model is not None:
            return reference_logps(self.model, examples, pad_id, dtype, chunk_mb=self.chunk_mb)
        cached = self.train if split == "train" else self.eval
        return None if cached is None else cached[list(indices)]


# ----------------------------------------------------------------------------- loss


def example_loss(
    model,
    examples: list[Example],
    ref: torch.Tensor | None,
    config: DPOConfig,
    pad_id: int,
    dtype,
    bco_delta: float = 0.0,
    rows: int | None = None,
    packed: bool = False,
) -> tuple[torch.Tensor, dict[str, float], dict[str, torch.Tensor]]:
    """Per-example losses (b,), logging stats (over the first ``rows`` examples, default all) and the loss batch,
    for pairs or KTO examples; `ref` (b, 2). ``packed``: pairs' sequences in one packed row (training)."""
    b = len(examples)
    rows = rows or b
    ref = torch.zeros(b, 2) if ref is None else ref
    if config.unpaired:
        logp, _ = sequence_logps(model, [e.seqs[0] for e in examples], pad_id, dtype, config.logprob_chunk_mb)  # (b,)
        with torch.no_grad():
            mismatched, _ = sequence_logps(model, [e.seqs[1] for e in examples], pad_id, dtype, config.logprob_chunk_mb)
        label = torch.tensor([float(e.label) for e in examples])
        kl_ref = kto_reference_kl(mismatched, ref[:, 1])
        fields = {"logp": logp, "ref_logp": ref[:, 0], "label": label, "kl_ref": kl_ref}
        losses = preference_loss(config.loss, fields, **config.loss_options)
        reward = config.beta * (logp - ref[:, 0]).detach()
        stats = {"policy/kl_ref": float(fields["kl_ref"])}
        for name, sel in (("chosen", label == 1), ("rejected", label == 0)):
            sel = sel & (torch.arange(b) < rows)
            if sel.any():
                stats[f"policy/reward_{name}"] = reward[sel].mean().item()
                stats[f"policy/logp_{name}"] = logp[sel].mean().item()
        return losses, stats, fields
    logps, lengths = sequence_logps(
        model,
        [e.seqs[0] for e in examples] + [e.seqs[1] for e in examples],
        pad_id,
        dtype,
        config.logprob_chunk_mb,
        packed,
    )
    fields = {
        "chosen": logps[:b],
        "rejected": logps[b:],
        "ref_chosen": ref[:, 0],
        "ref_rejected": ref[:, 1],
        "chosen_len": lengths[:b],
        "rejected_len": lengths[b:],
    }
    if config.needs_scores:
        fields["chosen_score"] = torch.tensor([e.scores[0] for e in examples])
        fields["rejected_score"] = torch.tensor([e.scores[1] for e in examples])
    if config.running_delta:
        fields["delta"] = torch.tensor(bco_delta)
    losses = preference_loss(config.loss, fields, **config.loss_options)
    counted = {key: value[:rows] for key, value in fields.items() if value.dim()}
    return losses, preference_stats(counted, config.beta, reference_free=not config.uses_reference), fields


def train_step(
    model,
    examples,
    ref,
    config: DPOConfig,
    pad_id,
    dtype,
    step: int,
    delta: RunningDelta,
    batch_size: int | None = None,
    real: int | None = None,
) -> dict[str, float]:
    """Forward/backward over grad_accum micro-batches; the loss is the mean over all ``batch_size`` examples of the
    step (default: ``examples``; with several processes ``examples`` is this rank's share). Only the first ``real``
    examples count (default all; the rest pad a rank's share so that every rank runs the same forwards).

    Stats are this rank's part of the step's mean times the world size (their mean over ranks is the mean)."""
    batch_size, real = batch_size or len(examples), len(examples) if real is None else real
    sums: dict[str, float] = {}
    for part, kept in micro_batches(examples, config, real):
        losses, stats, fields = example_loss(
            model,
            [examples[i] for i in part],
            None if ref is None else ref[part],
            config,
            pad_id,
            dtype,
            delta.value,
            kept,
            packed=config.max_tokens_per_microbatch is not None,
        )
        loss = losses[:kept].sum() / batch_size  # pads: forward and backward (the same collectives), gradient 0
        common.check_finite(loss, step)
        loss.backward()
        if config.running_delta:  # BCO's δ: running mean of the implicit rewards β·u of chosen and rejected
            delta.update(fields, config.beta, kept)
        weight = kept * runtime.world() / batch_size
        for key, value in {"loss": losses[:kept].mean().item() if kept else 0.0, **stats}.items():
            sums[key] = sums.get(key, 0.0) + (value * weight if kept else 0.0)
    return sums


def micro_batches(examples: list[Example], config: DPOConfig, real: int) -> list[tuple[torch.Tensor, int]]:
    """(example indices, how many of them count) per micro-batch: ``grad_accum`` equal parts, or with
    ``max_tokens_per_microbatch`` the pairs packed first-fit-decreasing by their two sequences' tokens. The real
    examples lead each part (indices < ``real``); with packing, every rank runs as many parts as the rank with the
    most (a repeat that counts 0), since each backward reduces gradients across ranks."""
    if config.max_tokens_per_microbatch is None:
        parts = torch.arange(len(examples)).tensor_split(config.grad_accum)  # equal parts when divisible
        return [(part, int((part < real).sum())) for part in parts if len(part)]
    lengths = [sum(len(s) for s in e.seqs) for e in examples]
    parts = [torch.tensor(sorted(b)) for b in packing.first_fit_decreasing(lengths, config.max_tokens_per_microbatch)]
    planned = [(part, int((part < real).sum())) for part in parts]
    return planned + [(parts[0], 0)] * runtime.parts_behind(len(planned))


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(
    model, tokenizer, examples, ref: Reference, gold_rows, config: DPOConfig, dtype, delta: RunningDelta
) -> tuple[dict, list]:
    """Held-out loss and implicit-reward stats, plus the gold score of greedy generations (built-in data)."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    pad_id = tokenizer.pad_token_id
    for start in range(0, len(examples), 64):
        chunk = examples[start : start + 64]
        ref_chunk = ref.logps("eval", range(start, start + len(chunk)), chunk, pad_id, dtype)
        losses, stats, _ = example_loss(model, chunk, ref_chunk, config, pad_id, dtype, delta.value)
        for key, value in {"loss": losses.mean().item(), **stats}.items():
            sums[key] = sums.get(key, 0.0) + value * len(chunk) / len(examples)
    metrics = {f"eval/{k.removeprefix('policy/')}": v for k, v in sums.items()}  # eval/loss, eval/reward_margin
    samples: list[dict] = []
    if gold_rows:
        gold, samples = gold_eval(model, tokenizer, gold_rows, config, dtype)
        metrics.update(gold)
    model.train(was_training)
    return metrics, samples


def gold_eval(model, tokenizer, rows: list[dict], config: DPOConfig, dtype) -> tuple[dict[str, float], list[dict]]:
    """Gold score of the policy on the distinct held-out prompts, and a few greedy samples.

    `eval/gold_score` = mean over prompts and `eval_samples` samples at temperature 1 of `gold_score`
    (the expected gold reward of π, what DPO's KL-regularised objective raises; seeded, so resumable);
    `eval/gold_score_greedy` = the same for the greedy answer (a mode estimate, brittle early on).
    """
    unique = list({r["prompt"]: r for r in rows}.values())
    engine = HFEngine(model, tokenizer, autocast_dtype=dtype)
    ids = [PromptFormat(config.chat).ids(tokenizer, r["prompt"]) for r in unique]

    def gold(batch, n):
        return [
            prefs.gold_score(unique[i // n]["prompt"], c, unique[i // n]["meta"])
            for i, c in enumerate(batch.completions)
        ]

    greedy = engine.generate(ids, SamplingParams(max_new_tokens=config.eval_max_new_tokens, greedy=True), n=1)
    sampled = engine.generate(
        ids,
        SamplingParams(max_new_tokens=config.eval_max_new_tokens, temperature=1.0),
        n=config.eval_samples,
        generator=torch.Generator().manual_seed(config.seed),
    )
    greedy_scores, sampled_scores = gold(greedy, 1), gold(sampled, config.eval_samples)
    samples = [
        {"prompt": r["prompt"], "greedy": c, "gold_score": g}
        for r, c, g in list(zip(unique, greedy.completions, greedy_scores))[: config.num_samples]
    ]
    metrics = {
        "eval/gold_score": sum(sampled_scores) / len(sampled_scores),
        "eval/gold_score_greedy": sum(greedy_scores) / len(greedy_scores),
    }
    return metrics, samples
