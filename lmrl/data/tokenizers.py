"""Tokenizers: built-in ones made locally with the `tokenizers` library, and HF loading.

`builtin:char` is a character-level tokenizer over printable ASCII (the built-in
tasks and the `pydoc_data.topics` corpus are printable ASCII), `builtin:bpe` a
byte-level BPE (vocabulary 1024) trained on the built-in corpus. Both carry the
ChatML template and need no network.
"""

from __future__ import annotations

import functools
import json
import os
import re
import warnings
from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from lmrl.data.chat import CHATML_TEMPLATE, ensure_chat_template

SPECIAL_TOKENS = ("<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>")
"""Special tokens of the built-in tokenizers, ids 0..4 in this order."""

CHAR_VOCAB = ("\n", "\t") + tuple(chr(c) for c in range(32, 127))
"""Characters of `builtin:char` after the special tokens: ids 5, 6, then 7..101 for ASCII 32..126."""

BUILTIN_BPE_VOCAB_SIZE = 1024

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files of which a local folder holding a tokenizer has at least one."""


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        unk_token="<|unk|>",
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHATML_TEMPLATE
    return hf


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: one id per special token, `\\n`, `\\t` and printable ASCII.

    A WordLevel model after a pre-tokenizer that isolates every character, and a
    Fuse decoder, so encode/decode round-trips printable ASCII exactly. Other
    characters map to `<|unk|>`. pad=`<|pad|>` (id 0), eos=`<|im_end|>`, no bos.
    """
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + CHAR_VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _wrap(tok)


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int = BUILTIN_BPE_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `texts` (Sennrich et al. 2016; GPT-2 byte-level variant).

    Same special tokens (ids 0..4), pad/eos/unk and ChatML template as
    `build_char_tokenizer`; any text round-trips (byte fallback, no unknowns).
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size={vocab_size} is too small for a byte-level BPE: it needs at least "
            f"{256 + len(SPECIAL_TOKENS)} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)."
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return _wrap(tok)


@functools.lru_cache(maxsize=1)
def _builtin_bpe_state() -> str:
    from lmrl.data.corpus import corpus_splits

    train, _ = corpus_splits()
    chunks = train.split("\n\n")
    return build_bpe_tokenizer(chunks, BUILTIN_BPE_VOCAB_SIZE).backend_tokenizer.to_str()


def build_builtin_bpe() -> PreTrainedTokenizerFast:
    """Byte-level BPE with 1024 ids trained on the training split of the built-in corpus."""
    return _wrap(Tokenizer.from_str(_builtin_bpe_state()))


BUILTIN_TOKENIZERS = {"builtin:char": build_char_tokenizer, "builtin:bpe": build_builtin_bpe}


def load_tokenizer(name_or_path: str, chat: bool = True, chat_template: str | None = None) -> PreTrainedTokenizerBase:
    """A built-in tokenizer (`builtin:char`, `builtin:bpe`), the tokenizer of a GGUF file (or of a folder holding one:
    `lmrl.models.gguf`), or `AutoTokenizer.from_pretrained`.

    After loading, a missing pad token is set to the eos token (never a new token: the vocabulary keeps its size)
    and the chat template is set (`set_chat_template`): ``chat_template`` when given; else, for ``chat`` runs, the
    tokenizer's own or ChatML (`ensure_chat_template`, with a one-line notice naming the tokens it adds); ``chat=False``
    runs (raw prompts) leave the tokenizer as it is.
    """
    if name_or_path in BUILTIN_TOKENIZERS:
        return set_chat_template(BUILTIN_TOKENIZERS[name_or_path](), name_or_path, chat, chat_template)
    if name_or_path.startswith("builtin:"):
        raise ValueError(
            f"unknown built-in tokenizer {name_or_path!r}; the built-in ones are {sorted(BUILTIN_TOKENIZERS)}."
        )
    path = os.path.expanduser(name_or_path)
    if not os.path.exists(path) and not _HUB_ID.match(name_or_path):
        raise ValueError(f"model path {name_or_path!r} not found; give a local path, a hub id, or builtin:char.")
    from lmrl.models.gguf import gguf_file, load_gguf_tokenizer  # here: lmrl.models imports this module

    gguf = gguf_file(path) if os.path.exists(path) else None
    tokenizer = load_gguf_tokenizer(gguf) if gguf is not None else _from_pretrained(name_or_path, path)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer {name_or_path!r} has neither a pad nor an eos token; set one in its tokenizer_config.json."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return set_chat_template(tokenizer, name_or_path, chat, chat_template)


def set_chat_template(tokenizer, name: str, chat: bool = True, chat_template: str | None = None):
    """``tokenizer`` with the chat template of `load_tokenizer`'s rules; returns it."""
    if chat_template is not None and chat_template != "chatml":
        path = os.path.expanduser(chat_template)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                chat_template = f.read()
        elif "{{" not in chat_template and "{%" not in chat_template:
            raise ValueError(
                f"chat_template={chat_template!r} is neither a file nor a Jinja template (no '{{{{' or '{{%'). Give a "
                "file holding the template, the template itself, or chatml."
            )
        tokenizer.chat_template = chat_template
        return tokenizer
    if chat_template == "chatml":
        tokenizer.chat_template = None
    elif not chat:
        return tokenizer
    had_template = bool(getattr(tokenizer, "chat_template", None))
    ensure_chat_template(tokenizer)
    added = getattr(tokenizer, "lmrl_added_tokens", None)
    if added and not had_template and chat_template is None:
        warnings.warn(
            f"{name} has no chat template: lmrl's ChatML adds {' and '.join(added)} as new tokens, whose embeddings "
            "start at the mean of the others (a base model has never seen them). Fix: chat_template=<file or Jinja "
            "string> for the model's own format, or chat=false to prompt with the raw text.",
            stacklevel=3,
        )
    return tokenizer


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _saved_class(path: str) -> str | None:
    """The tokenizer_class a local folder's tokenizer_config.json names (None: no such file or key)."""
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            return json.load(f).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None


def _from_pretrained(name_or_path: str, path: str) -> PreTrainedTokenizerBase:
    """`AutoTokenizer`, except for a folder whose tokenizer was saved as a generic `tokenizers` tokenizer (the
    built-in ones, or any tokenizer.json without a model-specific class): that loads as saved. AutoTokenizer would
    take the class of the folder's model type instead (transformers 5 turns a built-in tokenizer saved beside a
    qwen2 config.json into a Qwen2Tokenizer, which splits text differently)."""
    if (
        os.path.isdir(path)
        and _saved_class(path) in GENERIC_TOKENIZER_CLASSES
        and os.path.exists(os.path.join(path, "tokenizer.json"))
    ):
        return PreTrainedTokenizerFast.from_pretrained(path)
    try:
        return AutoTokenizer.from_pretrained(path if os.path.exists(path) else name_or_path)
    except (OSError, ValueError) as e:
        if os.path.isdir(path) and not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
            raise ValueError(
                f"folder {name_or_path!r} has no tokenizer ({', '.join(TOKENIZER_FILES)} are all missing). Fix: "
                "name one with tokenizer=... (the folder or .gguf file the model came from, a hub id, or "
                "builtin:char)."
            ) from None
        raise ValueError(
            f"could not load a tokenizer from {name_or_path!r} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}). Give a local directory with "
            "tokenizer files, a hub id reachable from this machine (or in the HF cache), "
            "or builtin:char."
        ) from e
