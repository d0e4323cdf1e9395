"""SFT's step: next-token cross-entropy on the labelled tokens of `lmrl.data.sft` examples, in micro-batches
(padded or packed), with the loss the token mean over the whole optimizer batch so that accumulation is exact.

Used by SFT (`lmrl.trainers.sft_method`) and by self-play's warm start (`lmrl.trainers.selfplay.start`).
"""

from __future__ import annotations

import torch

from lmrl.data import packing
from lmrl.data.sft import SFTExample, collate_sft
from lmrl.models.head import DEFAULT_CHUNK_MB
from lmrl.models.logprobs import labelled_logprobs
from lmrl.models.placement import model_device, to_device
from lmrl.parallel import runtime
from lmrl.trainers import common


def token_cross_entropy(
    model, batch: dict[str, torch.Tensor], dtype: torch.dtype | None, chunk_mb: float = DEFAULT_CHUNK_MB
) -> tuple[torch.Tensor, int]:
    """Summed next-token CE over labelled tokens of ``batch`` (padded rows, or packed ones: `lmrl.data.packing`) and
    the number of labelled tokens. Logits beyond ``chunk_mb`` of fp32 go through the LM head in chunks."""
    logp, labelled = labelled_logprobs(model, to_device(batch, model_device(model)), dtype, chunk_mb)
    return -logp.sum(), int(labelled.sum())


def labelled_tokens(examples: list[SFTExample]) -> int:
    return sum(sum(1 for y in ex.labels[1:] if y != -100) for ex in examples)


def padded_micro_batches(examples: list[SFTExample], pad_id: int, grad_accum: int) -> list[tuple[dict, float]]:
    """``grad_accum`` right-padded micro-batches of equal row counts, each with loss weight 1."""
    micro = len(examples) // grad_accum
    return [(collate_sft(examples[i * micro : (i + 1) * micro], pad_id), 1.0) for i in range(grad_accum)]


def packed_micro_batches(examples: list[SFTExample], max_tokens: int) -> list[tuple[dict, float]]:
    """The whole batch packed first-fit-decreasing into sequences of <= ``max_tokens`` tokens, dealt to the ranks by
    token count (`lmrl.data.packing`); this rank's share. A rank with one bin fewer than the others repeats one at
    loss weight 0, so every rank runs the same number of backward passes (each reduces gradients)."""
    lengths = [len(ex.input_ids) for ex in examples]
    bins = packing.first_fit_decreasing(lengths, max_tokens)
    shares = packing.balance(bins, lengths, runtime.world())
    mine = shares[runtime.rank()]
    batches = [(packing.pack([examples[i].input_ids for i in b], [examples[i].labels for i in b]), 1.0) for b in mine]
    while len(batches) < max(len(share) for share in shares):
        spare = mine[0] if mine else bins[0]
        batches.append((packing.pack([examples[i].input_ids for i in spare], [examples[i].labels for i in spare]), 0.0))
    return batches


def train_step(
    model,
    micro_batches: list[tuple[dict, float]],
    dtype,
    step: int,
    total_tokens: int,
    chunk_mb: float = DEFAULT_CHUNK_MB,
) -> dict[str, float]:
    """Forward/backward over ``micro_batches`` (batch, loss weight); the loss is the token mean over the whole
    optimizer batch, whose labelled tokens (over every rank) are ``total_tokens``."""
    loss_sum = 0.0
    for batch, weight in micro_batches:
        loss, _ = token_cross_entropy(model, batch, dtype, chunk_mb)
        common.check_finite(loss, step)
        (loss * (weight / total_tokens)).backward()
        loss_sum += weight * loss.item()
    return {"loss": loss_sum / total_tokens, "tokens": float(total_tokens)}


@torch.no_grad()
def eval_loss(model, examples: list[SFTExample], pad_id: int, dtype, batch_size: int = 64) -> float:
    total, tokens = 0.0, 0
    for start in range(0, len(examples), batch_size):
        loss, n = token_cross_entropy(model, collate_sft(examples[start : start + batch_size], pad_id), dtype)
        total, tokens = total + loss.item(), tokens + n
    return total / max(1, tokens)
