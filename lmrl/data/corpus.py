"""Text corpora for pretraining demos, and packing token ids into fixed windows.

The built-in corpus (`builtin:pydoc`) is the English documentation text that
ships inside CPython as `pydoc_data.topics` (the help() topics: the language
reference on statements, operators, types, ...), about 465 KB, normalised to
printable ASCII plus newlines so the character tokenizer covers every byte.
"""

from __future__ import annotations

import functools
import os
import unicodedata

import torch

_REPLACE = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2026": "...",
    "\u2014": "--",
    "\u2013": "-",
    "\u00df": "ss",
    "\u00b0": " degrees",
    "\u00a0": " ",
    "\t": "    ",
    "\r\n": "\n",
    "\r": "\n",
}


def to_printable_ascii(text: str) -> str:
    """Normalise to printable ASCII (32..126) plus `\\n`.

    Typographic quotes and dashes become ASCII ones, tabs four spaces, accented
    letters their base letter (NFKD), anything else is dropped.
    """
    for a, b in _REPLACE.items():
        text = text.replace(a, b)
    text = unicodedata.normalize("NFKD", text)
    return "".join(c for c in text if c == "\n" or 32 <= ord(c) < 127)


@functools.lru_cache(maxsize=1)
def builtin_corpus() -> str:
    """The topics of CPython's `pydoc_data.topics`, joined in sorted key order, as printable ASCII."""
    from pydoc_data.topics import topics

    return to_printable_ascii("\n\n".join(topics[k].strip("\n") for k in sorted(topics))) + "\n"


def corpus_splits(val_fraction: float = 0.05, text: str | None = None) -> tuple[str, str]:
    """Deterministic (train, val) split of `text` (default the built-in corpus).

    The last `val_fraction` of the characters, with the cut moved forward to the
    next line start (if not already at one; back to the start of the last line
    if the cut is inside it) so no line is split, is the validation text.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}.")
    text = builtin_corpus() if text is None else text
    cut = int(len(text) * (1.0 - val_fraction))
    newline = text.find("\n", max(cut - 1, 0))
    if newline != -1 and newline + 1 < len(text):
        cut = newline + 1  # forward to the next line start
    elif text.rfind("\n", 0, cut) != -1:
        cut = text.rfind("\n", 0, cut) + 1  # the last line: back to its start
    train, val = text[:cut], text[cut:]
    if not train or not val:
        raise ValueError(f"corpus of {len(text)} characters is too short to split with val_fraction={val_fraction}.")
    return train, val


def load_text_source(source: str, split: str = "train", text_column: str = "text") -> str:
    """Text of `builtin:pydoc`, a local `.txt`/`.md` file, or an HF dataset's `text` column.

    Dataset rows are joined with blank lines. Local datasets (saved with
    `save_to_disk`) and JSONL/Parquet/CSV files with a `text` column also work.
    """
    if source in ("builtin:pydoc", "builtin"):
        return builtin_corpus()
    if source.startswith("builtin:"):
        raise ValueError(f"unknown built-in corpus {source!r}; the built-in corpus is builtin:pydoc.")
    path = os.path.expanduser(source)
    if path.endswith((".txt", ".md", ".text")):
        if not os.path.isfile(path):
            raise ValueError(f"text file {source!r} not found; give an existing file or builtin:pydoc.")
        return _nonempty(source, read_text_file(path, source))
    from lmrl.data.loading import load_rows

    rows = load_rows(source, split=split)
    if not rows or text_column not in rows[0]:
        found = sorted(rows[0]) if rows else []
        raise ValueError(
            f"{source}: a text corpus needs a {text_column!r} column; found columns {found}. "
            "Rename the column or give a .txt file."
        )
    return _nonempty(source, "\n\n".join(str(r[text_column]) for r in rows))


def read_text_file(path: str, source: str) -> str:
    """A UTF-8 text file's text; binary input (a NUL byte, or bytes that are not UTF-8) is refused, naming the file
    and the offset, instead of training on replacement characters."""
    with open(path, "rb") as f:
        data = f.read()
    nul = data.find(b"\x00")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        nul, byte = e.start, data[e.start]
    else:
        byte = 0
    if nul >= 0:
        raise ValueError(
            f"text file {source!r} is not UTF-8 text (byte 0x{byte:02x} at offset {nul}): pretraining "
            "reads text. Give a text file (UTF-8), or convert it."
        )
    return text


def _nonempty(source: str, text: str) -> str:
    if not text.strip():
        raise ValueError(
            f"the corpus {source!r} is empty (no text to train on). Give a file with text, or builtin:pydoc."
        )
    return text


def pack_tokens(ids: list[int] | torch.Tensor, block_size: int) -> torch.Tensor:
    """Windows of `block_size + 1` consecutive tokens with stride `block_size`: (n_blocks, block_size + 1).

    n_blocks = (len(ids) - 1) // block_size. Window i is ids[i*bs : i*bs + bs + 1],
    so inputs = w[:, :-1], targets = w[:, 1:] and every token after the first is
    a target exactly once (trailing tokens that do not fill a window are dropped).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}.")
    t = torch.as_tensor(ids, dtype=torch.long).flatten()
    n_blocks = (t.numel() - 1) // block_size
    if n_blocks < 1:
        raise ValueError(
            f"{t.numel()} tokens are too few for one window of block_size + 1 = {block_size + 1} "
            "tokens; use a smaller block_size or more text."
        )
    starts = torch.arange(n_blocks) * block_size  # (n_blocks,)
    return t[starts[:, None] + torch.arange(block_size + 1)[None, :]]  # (n_blocks, block_size + 1)
