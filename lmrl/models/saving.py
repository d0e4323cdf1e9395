"""Saving a model: the one HF-format writer every checkpoint, `final/` and adapter goes through."""

from __future__ import annotations

from pathlib import Path


def save_model(model, tokenizer, path: str | Path, state_dict: dict | None = None) -> Path:
    """``model.save_pretrained`` + ``tokenizer.save_pretrained`` into ``path``, without HF's per-save progress bar
    (a run saves many checkpoints; the bar is only noise in its log). ``state_dict``: weights to save instead of the
    model's own (a sharded model's gathered full weights)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path, **({"state_dict": state_dict} if state_dict is not None else {}))
        tokenizer.save_pretrained(path)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    return Path(path)
