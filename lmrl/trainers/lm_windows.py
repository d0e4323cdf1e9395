"""Token windows of a text source and next-token cross-entropy on them: pretraining's data, loss and held-out
metric (`lmrl.trainers.pretrain`), also PPO-ptx's term and forgetting metric (`lmrl.trainers.rl.ptx`).

A window is ``block_size + 1`` consecutive tokens: inputs w[:, :-1], targets w[:, 1:]. The cross-entropy never
builds more than ``chunk_mb`` of fp32 logits when the model's LM head allows it (`lmrl.models.head`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from lmrl.data.corpus import corpus_splits, load_text_source, pack_tokens
from lmrl.models import autocast
from lmrl.models.head import DEFAULT_CHUNK_MB, chunked_head
from lmrl.models.hf_compat import no_cache
from lmrl.models.placement import model_device


@dataclasses.dataclass(frozen=True)
class Windows:
    """Token windows of the training and validation text; inputs w[:, :-1], targets w[:, 1:]."""

    train: torch.Tensor  # (n_train, block_size + 1) long
    val: torch.Tensor  # (n_val, block_size + 1) long
    summary: str


def load_windows(config, tokenizer) -> Windows:
    """Text of ``config.data`` (``data_split``, ``text_column``), split by ``val_fraction``, tokenized and packed into
    windows of ``block_size`` targets."""
    text = load_text_source(config.data, config.data_split, config.text_column)
    train_text, val_text = corpus_splits(config.val_fraction, text)
    parts = []
    for name, part in (("train", train_text), ("validation", val_text)):
        ids = tokenizer(part, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) < config.block_size + 1:
            raise ValueError(
                f"the {name} text of {config.data} has {len(ids)} tokens, too few for one window of "
                f"block_size + 1 = {config.block_size + 1}; lower block_size, change val_fraction "
                f"({config.val_fraction}) or give more text."
            )
        parts.append((ids, pack_tokens(ids, config.block_size)))
    unk = tokenizer.unk_token_id
    n_unk = sum(ids.count(unk) for ids, _ in parts) if unk is not None else 0
    n_tokens = sum(len(ids) for ids, _ in parts)
    summary = (
        f"{config.data}: {n_tokens} tokens ({n_unk / n_tokens:.2%} unknown), {len(parts[0][1])} train / "
        f"{len(parts[1][1])} val windows of {config.block_size}"
    )
    return Windows(train=parts[0][1], val=parts[1][1], summary=summary)


def chunked_ce(
    model, inputs: torch.Tensor, targets: torch.Tensor, chunk_mb: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Per-token -log π(y_t|s_t) (b, L) and, with_entropy, H[π(·|s_t)] (b, L), through the memory-bounded LM head
    (`lmrl.models.head`: never more than ``chunk_mb`` of fp32 logits, forward and backward); None when the logits
    fit in one chunk (then the ordinary forward is the way)."""
    parts = chunked_head(model, targets.numel(), chunk_mb)
    if parts is None:
        return None
    hidden = parts.decoder(input_ids=inputs, use_cache=False).last_hidden_state  # (b, L, H)
    if not with_entropy:
        return -parts.logprobs(hidden, targets, chunk_mb=chunk_mb), None
    logp, entropy = parts.logprobs(hidden, targets, chunk_mb=chunk_mb, return_entropy=True)
    return -logp, entropy


def mean_ce(model, windows: torch.Tensor, dtype, chunk_mb: float = DEFAULT_CHUNK_MB) -> torch.Tensor:
    """Mean next-token cross-entropy -log π(y_t|s_t) over every target of ``windows`` (b, L+1), on the model's
    device, with gradient: through the chunked head (`chunked_ce`), or full logits when they fit in one chunk."""
    inputs, targets = windows[:, :-1], windows[:, 1:]  # (b, L) each
    with autocast(model_device(model).type, dtype):
        nll = chunked_ce(model, inputs, targets, chunk_mb)
        if nll is None:
            logits = model(input_ids=inputs, **no_cache(model)).logits  # (b, L, V)
    if nll is not None:
        return nll[0].mean()
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # (b·L, V) vs (b·L,)


@torch.no_grad()
def validation_stats(
    model, windows: torch.Tensor, batch_size: int, dtype, chunk_mb: float = DEFAULT_CHUNK_MB
) -> dict[str, float]:
    """Over every target of ``windows`` (n, L+1), in nats/token: ``eval/ce`` = mean -log π(y_t|s_t) (full
    vocabulary) and ``eval/entropy`` = mean H[π(·|s_t)]; entropy > CE means over-dispersed predictions."""
    was_training = model.training
    model.eval()
    ce, entropy, count = 0.0, 0.0, 0
    device = model_device(model)
    for batch in windows.to(device).split(batch_size):
        inputs, targets = batch[:, :-1], batch[:, 1:]  # (b, L) each
        with autocast(device.type, dtype):
            nll = chunked_ce(model, inputs, targets, chunk_mb, with_entropy=True)
            if nll is None:
                log_p = model(input_ids=inputs, **no_cache(model)).logits.float().log_softmax(-1)  # (b, L, V)
                nll = (-log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(log_p.exp() * log_p).sum(-1))
        ce += nll[0].sum().item()
        entropy += nll[1].sum().item()
        count += targets.numel()
    model.train(was_training)
    return {"eval/ce": ce / count, "eval/entropy": entropy / count}
