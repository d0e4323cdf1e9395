"""Built-in corpus, text sources and token packing."""

import json

import pytest
import torch

from lmrl.data.corpus import builtin_corpus, corpus_splits, load_text_source, pack_tokens, to_printable_ascii


def test_builtin_corpus_is_large_printable_english():
    text = builtin_corpus()
    assert len(text) > 300_000
    assert all(ch == "\n" or 32 <= ord(ch) < 127 for ch in text)
    assert 'The "if" statement is used for conditional execution' in text
    assert text.startswith('The "assert" statement')  # topics joined in sorted key order: "assert" first
    assert builtin_corpus() is text  # cached


def test_to_printable_ascii_hand_cases():
    assert to_printable_ascii("\u2018a\u2019 \u201cb\u201d \u2026 \u2014 \u2013 \u00df \u00e9\tx\r\n\u2603") == (
        "'a' \"b\" ... -- - ss e    x\n"
    )


def test_corpus_splits_deterministic_and_line_aligned():
    train, val = corpus_splits(0.05)
    text = builtin_corpus()
    assert train + val == text
    assert (train, val) == corpus_splits(0.05)
    assert train.endswith("\n")
    cut = int(len(text) * 0.95)
    assert cut <= len(train) < cut + 2000  # moved forward to the next line start only
    # 12 chars, cut int(12 * 0.5) = 6 is the start of "l3": kept
    assert corpus_splits(0.5, text="l1\nl2\nl3\nl4\n") == ("l1\nl2\n", "l3\nl4\n")
    # val_fraction 0.75: cut int(12 * 0.25) = 3 is the start of "l2": kept
    assert corpus_splits(0.75, text="l1\nl2\nl3\nl4\n") == ("l1\n", "l2\nl3\nl4\n")
    # 9 chars "abcd\nefg\n", cut int(9 * 0.5) = 4 is mid-line ("\n" at 4): moved to 5
    assert corpus_splits(0.5, text="abcd\nefg\n") == ("abcd\n", "efg\n")
    # cut int(9 * 0.7) = 6 is inside the last line "efg": moved back to its start, 5
    assert corpus_splits(0.3, text="abcd\nefg\n") == ("abcd\n", "efg\n")
    # 1 char: cut int(1 * 0.95) = 0 leaves no training text
    with pytest.raises(ValueError, match="too short to split"):
        corpus_splits(0.05, text="a")
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 1\)"):
        corpus_splits(1.0)


def test_load_text_source(tmp_path):
    assert load_text_source("builtin:pydoc") == builtin_corpus()
    txt = tmp_path / "a.txt"
    txt.write_text("hello\nworld\n")
    assert load_text_source(str(txt)) == "hello\nworld\n"
    js = tmp_path / "t.jsonl"
    js.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"text": "two"}) + "\n")
    assert load_text_source(str(js)) == "one\n\ntwo"
    js2 = tmp_path / "u.jsonl"
    js2.write_text(json.dumps({"body": "one"}) + "\n")
    with pytest.raises(ValueError, match=r"needs a 'text' column; found columns \['body'\]"):
        load_text_source(str(js2))
    with pytest.raises(ValueError, match="text file .* not found"):
        load_text_source(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="unknown built-in corpus 'builtin:wiki'"):
        load_text_source("builtin:wiki")


def test_pack_tokens_windows():
    # 10 tokens, block 3: (10 - 1) // 3 = 3 windows of 4 with stride 3
    out = pack_tokens(list(range(10)), 3)
    assert out.dtype == torch.long
    assert torch.equal(out, torch.tensor([[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]))
    # 8 tokens, block 3: 7 // 3 = 2 windows; token 7 is dropped
    assert torch.equal(pack_tokens(torch.arange(8), 3), torch.tensor([[0, 1, 2, 3], [3, 4, 5, 6]]))
    inputs, targets = out[:, :-1], out[:, 1:]
    assert torch.equal(targets.flatten(), torch.arange(1, 10))  # every token after the first is a target once
    assert torch.equal(inputs.flatten(), torch.arange(0, 9))
    with pytest.raises(ValueError, match="too few for one window"):
        pack_tokens([1, 2, 3], 3)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        pack_tokens([1, 2, 3], 0)
