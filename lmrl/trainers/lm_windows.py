"""Pretraining data: a text source cut into training and validation text, tokenized and packed into windows."""

from __future__ import annotations

import dataclasses

import torch

from lmrl.data.corpus import corpus_splits, load_text_source, pack_tokens
from lmrl.trainers.pretrain.config import PretrainConfig


@dataclasses.dataclass(frozen=True)
class Windows:
    """Token windows of the training and validation text; inputs w[:, :-1], targets w[:, 1:]."""

    train: torch.Tensor  # (n_train, block_size + 1) long
    val: torch.Tensor  # (n_val, block_size + 1) long
    summary: str


def load_windows(config: PretrainConfig, tokenizer) -> Windows:
    """Text of ``config.data``, split by ``val_fraction``, tokenized and packed into windows."""
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
