"""Data paths checked at start-up with messages that name the key (issue 33): a missing file, a folder or a FIFO where
a file is meant; a pretraining corpus that is binary or empty names its file."""

import os

import pytest

from lmrl.data.corpus import load_text_source
from lmrl.data.loading import check_sources, load_rows, local_source_problem


def test_fifo_folder_and_missing_files_are_named_as_such(tmp_path):
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    (tmp_path / "dir.jsonl").mkdir()
    assert "not a regular file" in local_source_problem(str(fifo))  # was: "not found"
    assert "is a directory" in local_source_problem(str(tmp_path / "dir.jsonl"))
    assert "not found" in local_source_problem(str(tmp_path / "missing.jsonl"))
    assert local_source_problem("task:arithmetic") is None and local_source_problem("org/some-dataset") is None
    with pytest.raises(ValueError, match="not a regular file"):
        load_rows(str(fifo))  # never opened: a FIFO would block the read


def test_check_sources_names_the_key():
    class Config:
        dataset, eval_dataset = "task:arithmetic", "./missing.jsonl"

    with pytest.raises(ValueError, match="'eval_dataset': data file './missing.jsonl' not found"):
        check_sources(Config())


def test_pretraining_refuses_binary_input_and_names_an_empty_corpus(tmp_path):
    binary, empty, text = tmp_path / "img.txt", tmp_path / "empty.txt", tmp_path / "ok.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    empty.write_text("  \n\n")
    text.write_text("héllo world\n")
    with pytest.raises(ValueError, match=r"img.txt' is not UTF-8 text \(byte 0x"):  # was: trained on U+FFFD
        load_text_source(str(binary))
    with pytest.raises(ValueError, match="empty.txt' is empty"):
        load_text_source(str(empty))
    assert load_text_source(str(text)) == "héllo world\n"
