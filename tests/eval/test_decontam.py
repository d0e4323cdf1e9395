"""8-gram decontamination: tokens, grams, a planted overlap found, the built-in splits clean."""

from __future__ import annotations

import json

from lmrl.cli import main
from lmrl.data.loading import load_rows
from lmrl.eval.decontam import ngrams, overlap, row_texts, tokens

LONG = "the quick brown fox jumps over the lazy dog near the river bank"


def test_tokens_and_ngrams_by_hand():
    assert tokens("12+34=") == ["12", "+", "34", "="]
    assert tokens("Hello, World") == ["hello", ",", "world"]
    assert ngrams("a b c", n=8) == {("a", "b", "c")}  # shorter than n: the text itself
    grams = ngrams(LONG, n=8)  # 13 tokens -> 6 windows
    assert len(grams) == 6 and ("the", "quick", "brown", "fox", "jumps", "over", "the", "lazy") in grams
    assert ngrams("", n=8) == set()


def test_row_texts_reads_messages_and_skips_answers():
    row = {
        "messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "yo"}],
        "answer": "secret",
        "meta": {"x": "y"},
    }
    assert row_texts(row) == ["hi there", "yo"]


def test_planted_overlap_is_found_and_the_rest_is_clean():
    evals = [{"prompt": f"question number {i} asks about topic {i * 7} in a long enough sentence"} for i in range(10)]
    train = [{"prompt": "completely unrelated words that share nothing with any evaluation item at all"}]
    train.append({"prompt": "Prefix text. " + evals[3]["prompt"] + " and more"})  # planted: eval row 3 inside
    train.append({"messages": [{"role": "user", "content": evals[7]["prompt"].upper()}]})  # planted, case changed
    report = overlap(train, evals, n=8)
    assert report.contaminated == [3, 7]
    assert report.shares[3] == 1.0 and report.shares[0] < 0.5
    assert report.fraction == 0.2


def test_partial_overlap_below_threshold_is_not_flagged():
    eval_text = "one two three four five six seven eight nine ten eleven twelve"  # 5 eight-grams
    train_text = "one two three four five six seven eight nine"  # holds 2 of them
    report = overlap([train_text], [eval_text], n=8, threshold=0.5)
    assert report.shares == [2 / 5] and report.contaminated == []
    assert overlap([train_text], [eval_text], n=8, threshold=0.4).contaminated == [0]


def test_builtin_task_splits_do_not_overlap():
    train = load_rows("task:arithmetic", split="train", limit=2000)
    test = load_rows("task:arithmetic", split="test", limit=200)
    assert overlap(train, test, n=8).contaminated == []


def test_decontaminate_command_finds_planted_rows(tmp_path, capsys):
    test = load_rows("task:arithmetic", split="test", limit=50)
    train = load_rows("task:arithmetic", split="train", limit=300) + [test[5], test[17]]
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report.json"
    assert (
        main(
            [
                "decontaminate",
                f"train={tmp_path / 'train.jsonl'}",
                f"eval={tmp_path / 'test.jsonl'}",
                f"output_file={out}",
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["contaminated_indices"] == [5, 17] and report["contaminated_rows"] == 2
    assert "2 of 50 eval rows" in capsys.readouterr().out


def test_tool_task_traces_are_not_compared_as_the_question():
    """A tool task's eval rows carry the reference trace in `messages` (the tool's output and the final answer are
    the gold answer): only what the model is asked is compared, so distinct problems with equal products are clean
    and a planted problem is still found."""
    train = load_rows("task:tool_arithmetic", split="train", limit=1000, digits=2)
    test = load_rows("task:tool_arithmetic", split="test", limit=100, digits=2)
    assert not {r["prompt"] for r in test} & {r["prompt"] for r in train}
    assert overlap(train, test, n=8).contaminated == []
    assert overlap(train + [test[9]], test, n=8).contaminated == [9]
    asked = row_texts(test[0], ("prompt", "messages"), ("system", "user"))
    assert asked == [test[0]["prompt"]] * 2 and test[0]["answer"] not in asked
