"""Data: tokenizers, chat templates and loss masks, dataset loading with schema checks,
built-in tasks and corpus. Names are imported lazily so that `lmrl.data.tasks`
does not pull in transformers."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_char_tokenizer": "tokenizers",
    "build_bpe_tokenizer": "tokenizers",
    "load_tokenizer": "tokenizers",
    "CHATML_TEMPLATE": "chat",
    "IGNORE_INDEX": "chat",
    "ensure_chat_template": "chat",
    "validate_messages": "chat",
    "render_prompt": "chat",
    "encode_prompt": "chat",
    "PromptFormat": "prompt_format",
    "tokenize_conversation": "chat",
    "tokenize_prompt_completion": "chat",
    "load_rows": "loading",
    "detect_format": "loading",
    "SFTExample": "sft",
    "build_sft_examples": "sft",
    "collate_sft": "sft",
    "builtin_corpus": "corpus",
    "corpus_splits": "corpus",
    "load_text_source": "corpus",
    "pack_tokens": "corpus",
    "TASKS": "tasks",
    "get_task": "tasks",
    "make_rows": "tasks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"lmrl.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'lmrl.data' has no attribute {name!r}")
