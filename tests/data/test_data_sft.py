"""build_sft_examples (formats, validation, overlong handling) and collate_sft."""

import csv
import json

import pytest
import torch

from lmrl.data.loading import load_rows
from lmrl.data.sft import SFTExample, build_sft_examples, collate_sft
from lmrl.data.tokenizers import build_char_tokenizer

M, S, E, NL = -100, 2, 3, 5


def c(text):
    return [5 if ch == "\n" else ord(ch) - 25 for ch in text]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_prompt_completion_rows_chat(tok):
    examples, stats = build_sft_examples([{"prompt": "1+2=", "completion": "3"}], tok, max_length=64)
    prompt = [S] + c("user\n1+2=") + [E, NL, S] + c("assistant\n")
    assert examples == [SFTExample(prompt + c("3") + [E, NL], [M] * len(prompt) + c("3") + [E, M])]
    assert stats == {"rows": 1, "overlong": 0, "dropped": 0, "truncated": 0}


def test_messages_rows_train_on_last(tok):
    rows = [
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "d"},
            ]
        }
    ]
    (all_,), _ = build_sft_examples(rows, tok, 128, train_on="all")
    (last,), _ = build_sft_examples(rows, tok, 128, train_on="last")
    assert all_.input_ids == last.input_ids
    assert [i for i, l in zip(all_.input_ids, all_.labels) if l != M] == c("b") + [E] + c("d") + [E]
    assert [i for i, l in zip(last.input_ids, last.labels) if l != M] == c("d") + [E]


def test_overlong_truncate_drop_error(tok):
    # chat=False lengths: len(prompt) + len(completion) + 1 (EOS)
    rows = [
        {"prompt": "ab", "completion": "cd"},  # 5 tokens: fits
        {"prompt": "abcdef", "completion": "gh"},  # 9 tokens: overlong; first 8 keep "gh" learned
        {"prompt": "abcdefghij", "completion": "k"},  # 12 tokens: first 8 are all prompt
    ]
    ex, stats = build_sft_examples(rows, tok, max_length=8, overlong="truncate", chat=False)
    assert stats == {"rows": 3, "overlong": 2, "dropped": 1, "truncated": 1}
    assert ex[1] == SFTExample(c("abcdefgh"), [M] * 6 + c("gh"))  # EOS cut off
    ex, stats = build_sft_examples(rows, tok, max_length=8, overlong="drop", chat=False)
    assert stats == {"rows": 3, "overlong": 2, "dropped": 2, "truncated": 0}
    assert ex == [SFTExample(c("abcd") + [E], [M, M] + c("cd") + [E])]
    with pytest.raises(ValueError) as e:
        build_sft_examples(rows, tok, max_length=8, overlong="error", chat=False, where="d.jsonl")
    msg = str(e.value)
    assert msg.startswith("d.jsonl: 2 of 3 rows are longer than max_length=8 tokens (rows 2, 3)")
    assert "overlong=truncate" in msg and "overlong=drop" in msg and "max_length" in msg
    with pytest.raises(ValueError, match="all 1 rows were dropped"):
        build_sft_examples(rows[2:], tok, max_length=8, overlong="drop", chat=False)


def test_empty_completion_names_row(tok):
    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "  "}]
    with pytest.raises(ValueError, match=r"^row 2 of train.jsonl: empty completion"):
        build_sft_examples(rows, tok, 64, where="train.jsonl")
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]}]
    with pytest.raises(ValueError, match=r"^row 1 of d: assistant message 1 is empty"):
        build_sft_examples(rows, tok, 64, where="d")


def test_bad_roles_and_columns_name_row(tok):
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    bad = {"messages": [{"role": "assistant", "content": "b"}, {"role": "user", "content": "a"}]}
    with pytest.raises(ValueError, match=r"^row 3 of d: bad role order \['assistant', 'user'\]"):
        build_sft_examples([good, good, bad], tok, 64, where="d")
    with pytest.raises(ValueError, match=r"^d: found columns \['text'\]"):
        build_sft_examples([{"text": "x"}], tok, 64, where="d")
    with pytest.raises(ValueError, match=r"^row 2 of d: needs columns \['prompt', 'completion'\], found \['prompt'\]"):
        build_sft_examples([{"prompt": "a", "completion": "b"}, {"prompt": "a"}], tok, 64, where="d")
    with pytest.raises(ValueError, match="overlong must be"):
        build_sft_examples([good], tok, 64, overlong="clip")


def test_messages_from_csv_json_text(tok, tmp_path):
    path = tmp_path / "m.csv"
    msgs = [{"role": "user", "content": "hi, you"}, {"role": "assistant", "content": "yo"}]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["messages"])
        w.writerow([json.dumps(msgs)])
        w.writerow(["not json"])
    rows = load_rows(str(path))
    (ex,), _ = build_sft_examples(rows[:1], tok, 64)
    assert [i for i, l in zip(ex.input_ids, ex.labels) if l != M] == c("yo") + [E]
    with pytest.raises(ValueError, match="row 2 of m.csv: 'messages' is a string that is not valid JSON"):
        build_sft_examples(rows, tok, 64, where="m.csv")


def test_collate_sft_right_pads():
    batch = collate_sft([SFTExample([5, 6, 7], [M, 6, 7]), SFTExample([8], [8])], pad_id=0)
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 7], [8, 0, 0]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 1], [1, 0, 0]]))
    assert torch.equal(batch["labels"], torch.tensor([[M, 6, 7], [8, M, M]]))
    assert batch["input_ids"].dtype == torch.long
    with pytest.raises(ValueError, match="empty list"):
        collate_sft([], 0)
    with pytest.raises(ValueError, match="example 0 has 2 input ids but 1 labels"):
        collate_sft([SFTExample([1, 2], [1])], 0)
