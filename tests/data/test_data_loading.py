"""load_rows over tasks, JSONL/JSON/CSV/Parquet files and local HF datasets; schema errors."""

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmrl.data.loading import check_completion, detect_format, load_rows, require_columns

ROWS = [
    {"prompt": "1+1=", "completion": "2"},
    {"prompt": "2+2=", "completion": "4"},
    {"prompt": "3+3=", "completion": "6"},
]


def write_jsonl(path, rows, extra_lines=()):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return str(path)


def test_jsonl_rows_limit_and_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n   \n" + json.dumps(ROWS[2]) + "\n")
    assert load_rows(str(path)) == ROWS
    assert load_rows(str(path), limit=2) == ROWS[:2]


def test_jsonl_malformed_line_names_line_and_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n" + '{"prompt": "x", "completion": }' + "\n")
    with pytest.raises(ValueError, match=r"^bad.jsonl: line 3 is not valid JSON"):
        load_rows(str(path))
    path.write_text(json.dumps(ROWS[0]) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"^bad.jsonl: line 2 is a JSON list, not an object"):
        load_rows(str(path))


def test_json_list_columns_and_jsonl_in_json(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(ROWS))
    assert load_rows(str(a)) == ROWS
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"prompt": [r["prompt"] for r in ROWS], "completion": [r["completion"] for r in ROWS]}))
    assert load_rows(str(b)) == ROWS
    c = tmp_path / "c.json"
    write_jsonl(c, ROWS)
    assert load_rows(str(c)) == ROWS
    d = tmp_path / "d.json"
    d.write_text('"just a string"')
    with pytest.raises(ValueError, match="expected a JSON list of row objects"):
        load_rows(str(d))


def test_csv_rows(tmp_path):
    path = tmp_path / "d.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["prompt", "completion"])
        w.writeheader()
        w.writerows(ROWS)
    assert load_rows(str(path)) == ROWS
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,completion\na,b\nc,d,e\n")
    with pytest.raises(ValueError, match=r"row 2 \(line 3\) has more fields than the header"):
        load_rows(str(bad))


def test_parquet_rows(tmp_path):
    path = tmp_path / "d.parquet"
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert load_rows(str(path)) == rows


def test_local_hf_dataset_dirs(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert load_rows(str(tmp_path / "saved"), limit=2) == ROWS[:2]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:1]), "test": datasets.Dataset.from_list(ROWS[1:])}
    ).save_to_disk(str(tmp_path / "dd"))
    assert load_rows(str(tmp_path / "dd"), split="test") == ROWS[1:]
    with pytest.raises(ValueError, match=r"no split 'validation'; the splits are \['test', 'train'\]"):
        load_rows(str(tmp_path / "dd"), split="validation")


def test_missing_sources_are_clear(tmp_path):
    with pytest.raises(ValueError, match=r"data file '.*nope.jsonl' not found"):
        load_rows(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match=r"dataset path '.*nodir' not found"):
        load_rows(str(tmp_path / "nodir"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no rows found"):
        load_rows(str(empty))
    with pytest.raises(ValueError, match=r"extra arguments \['digits'\] only apply to built-in tasks"):
        load_rows(str(empty), digits=3)


def test_task_source():
    rows = load_rows("task:arithmetic", split="test", limit=5, digits=3, seed=1)
    assert len(rows) == 5
    assert set(rows[0]) == {"task", "prompt", "completion", "answer", "meta"}
    assert all(r["task"] == "arithmetic" for r in rows)
    assert all(max(len(x) for x in r["meta"]["expression"].replace("-", "+").split("+")) <= 3 for r in rows)
    assert rows == load_rows("task:arithmetic", split="test", limit=5, digits=3, seed=1)
    assert len(load_rows("task:sorting")) == 1000  # DEFAULT_TASK_ROWS
    with pytest.raises(ValueError, match="unknown task 'sortin'.*Did you mean 'sorting'"):
        load_rows("task:sortin")


def test_detect_format():
    assert detect_format(["messages", "id"], "d") == "messages"
    assert detect_format(["prompt", "completion", "answer"], "d") == "prompt_completion"
    with pytest.raises(ValueError) as e:
        detect_format(["question", "answer"], "train.jsonl")
    msg = str(e.value)
    assert msg.startswith("train.jsonl: found columns ['answer', 'question']")
    assert "'messages'" in msg and "'prompt' and 'completion'" in msg


def test_require_columns_and_check_completion():
    require_columns(["prompt", "answer"], ["prompt"], "d")
    with pytest.raises(ValueError, match=r"d: missing column\(s\) \['answer'\]; found columns \['prompt'\]"):
        require_columns(["prompt"], ["prompt", "answer"], "d")
    with pytest.raises(ValueError, match="row 4 of d: empty completion"):
        check_completion("  \n", "row 4 of d")
    with pytest.raises(ValueError, match="row 4 of d: completion must be a string, got int"):
        check_completion(3, "row 4 of d")


def test_task_source_limit_is_at_most_but_n_is_exact():
    # 1-digit addition has 100 problems; about 10% hash to the test split
    rows = load_rows("task:arithmetic", split="test", limit=100, digits=1, ops="+")
    assert 0 < len(rows) < 30 and len({r["prompt"] for r in rows}) == len(rows)
    with pytest.raises(ValueError, match="unique test problems"):
        load_rows("task:arithmetic", split="test", n=100, digits=1, ops="+")


def test_a_non_utf8_file_is_named(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9", "completion": "x"}\n')
    with pytest.raises(ValueError, match="latin1.jsonl.*not UTF-8.*0xe9"):
        load_rows(str(path))


def test_a_csv_with_an_unclosed_quote_is_reported_as_such(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('prompt,completion\n"what is 1+1,2\nok,fine\n')
    with pytest.raises(ValueError, match="d.csv: not valid CSV.*unclosed quote"):
        load_rows(str(path))
