"""Preference data: the gold score by hand, built-in generators, row validation errors, tokenisation, collation."""

import json
import re

import pytest
import torch

from lmrl.cli import main
from lmrl.data import preference as prefs
from lmrl.data.chat import render_prompt
from lmrl.data.tokenizers import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


# --------------------------------------------------------------------------- gold score


@pytest.mark.parametrize(
    "prompt, completion, meta, expected",
    [
        # a = 46: g = [v=a] + 1/(1+|v-a|) - 0.05*extra
        ("12+34=", "46", None, 1 + 1 / 1 - 0.0),  # 2.0
        ("12+34=", "47", None, 0 + 1 / 2 - 0.0),  # 0.5
        ("12+34=", "36", None, 0 + 1 / 11),  # 0.0909...
        ("12+34=", "the answer is 46", None, 1 + 1 - 0.05 * 14),  # 16 chars, 14 not "46": 1.3
        ("12+34=", "  46  ", None, 2.0),  # stripped first
        ("12+34=", "4 then 46", None, 2 - 0.05 * 7),  # last integer counts: 1.65
        ("12+34=", "xyz", None, -1 - 0.05 * 3),  # no integer: -1.15
        ("12+34=", "", None, -1.0),
        ("1-4=", "-3", None, 2.0),  # negative answers: "-3" is the integer
        ("anything", "5", {"answer": 5}, 2.0),  # meta["answer"] wins over the prompt
        ("anything", "7", {"answer": "5"}, 1 / 3),
    ],
)
def test_gold_score_matches_hand_computation(prompt, completion, meta, expected):
    assert prefs.gold_score(prompt, completion, meta) == pytest.approx(expected, abs=1e-12)


def test_gold_score_needs_an_answer():
    with pytest.raises(ValueError, match="cannot find the answer of prompt 'hello'"):
        prefs.gold_score("hello", "5")


# --------------------------------------------------------------------------- built-in generators


def test_preference_rows_are_ranked_by_gold_score_and_deterministic():
    rows = prefs.preference_rows(200, split="train", seed=3, digits=1)
    assert rows == prefs.preference_rows(200, split="train", seed=3, digits=1)
    assert rows != prefs.preference_rows(200, split="train", seed=4, digits=1)
    for r in rows:
        c, rj = (
            prefs.gold_score(r["prompt"], r["chosen"], r["meta"]),
            prefs.gold_score(r["prompt"], r["rejected"], r["meta"]),
        )
        assert c > rj and r["chosen"] != r["rejected"]
        assert r["chosen_score"] == pytest.approx(c, abs=1e-8) and r["rejected_score"] == pytest.approx(rj, abs=1e-8)
        assert r["meta"]["answer"] == int(r["answer"]) == eval(r["prompt"].rstrip("="))
    kinds = {
        ("garbage" if not re.search(r"\d", t) else "text" if re.search(r"[a-z:=]", t) else "number")
        for r in rows
        for t in (r["chosen"], r["rejected"])
    }
    assert kinds == {"garbage", "text", "number"}  # varying quality and length


def test_ranked_rows_have_distinct_scores_and_disjoint_splits():
    rows = prefs.preference_rows(50, split="train", num_completions=4, digits=2)
    for r in rows:
        assert len(r["completions"]) == 4 and len(set(r["scores"])) == 4
        assert r["scores"] == pytest.approx([prefs.gold_score(r["prompt"], c, r["meta"]) for c in r["completions"]])
    train = {r["prompt"] for r in prefs.preference_rows(500, split="train", digits=1)}
    test = {r["prompt"] for r in prefs.preference_rows(100, split="test", digits=1)}
    assert test and not train & test
    assert len(prefs.preference_rows(100, split="test", digits=1)) == 100  # small test split cycles its prompts


def test_preference_rows_bad_arguments():
    with pytest.raises(ValueError, match="num_completions must be >= 2"):
        prefs.preference_rows(5, num_completions=1)
    with pytest.raises(ValueError, match="unknown candidate kind 'wrong'"):
        prefs.preference_rows(5, kinds=("correct", "wrong"))
    with pytest.raises(ValueError, match="distinct gold scores"):
        prefs.preference_rows(5, kinds=("correct",))


def test_orm_rows_label_is_correctness():
    rows = prefs.orm_rows(1000, digits=1)
    assert 0.45 < sum(r["label"] for r in rows) / 1000 < 0.55  # balanced: majority-class accuracy is 0.5
    for r in rows:
        assert r["label"] == int(r["completion"] == r["answer"])  # bare integers: correct iff equal
    for r in prefs.orm_rows(200, wrong_kinds=("verbose", "garbage")):
        last = re.findall(r"-?\d+", r["completion"])
        assert r["label"] == int(bool(last) and last[-1] == r["answer"])
    with pytest.raises(ValueError, match="unknown candidate kind 'nearr'"):
        prefs.orm_rows(5, wrong_kinds=("nearr",))


def test_prm_rows_labels_follow_the_first_error():
    rows = prefs.prm_rows(200, n_operands=3)
    assert any(-1 in r["labels"] for r in rows) and any(set(r["labels"]) == {1} for r in rows)
    for r in rows:
        wrong_seen = False
        expected_total = None
        for step, label in zip(r["completions"], r["labels"]):
            left, op, x, value = re.fullmatch(r"(-?\d+)([+-])(\d+)=(-?\d+)", step).groups()
            right = int(left) + int(x) if op == "+" else int(left) - int(x)
            if expected_total is not None:
                assert int(left) == expected_total  # each step starts from the previous step's result
            if int(value) != right:
                assert label == -1 and not wrong_seen
                wrong_seen = True
            else:
                assert label == (0 if wrong_seen else 1)
            expected_total = int(value)
        assert (expected_total == int(r["answer"])) == (not wrong_seen)


def test_chat_style_rows_and_always_correct_pairs_the_correct_answer_with_a_wrong_one():
    chat = prefs.load_preference_rows("builtin:prefs", "train", 40, digits=2, style="chat")
    assert chat[0]["prompt"].startswith("What is ") and all(r["meta"]["style"] == "chat" for r in chat)
    for r in chat:  # ranked by the gold score of the answer in meta, the prompt being no expression
        assert (
            r["chosen_score"] == round(prefs.gold_score(r["prompt"], r["chosen"], r["meta"]), 9) > r["rejected_score"]
        )
    default = prefs.preference_rows(200, seed=2)
    assert prefs.preference_rows(200, seed=2, always_correct=False) == default  # default rows unchanged
    assert any(not re.fullmatch(str(r["answer"]), r["chosen"]) for r in default)  # a ranking, not right vs wrong
    for r in prefs.preference_rows(200, seed=2, kinds=("near", "far"), always_correct=True):
        assert r["chosen"] == str(r["answer"]) and int(r["rejected"]) != r["meta"]["answer"]
    for r in prefs.preference_rows(50, num_completions=4, kinds=("near", "far", "garbage"), always_correct=True):
        assert str(r["answer"]) in r["completions"] and max(r["scores"]) == 2.0


def test_load_preference_rows_builtin_and_files(tmp_path):
    assert len(prefs.load_preference_rows("builtin:prefs", "train", 7)) == 7
    assert len(prefs.load_preference_rows("builtin:orm", "test", 5, digits=1)) == 5
    with pytest.raises(ValueError, match="unknown built-in preference source 'builtin:pref'"):
        prefs.load_preference_rows("builtin:pref")
    with pytest.raises(ValueError, match=r"no parameter\(s\) \[.digitz.\]"):
        prefs.load_preference_rows("builtin:prefs", digitz=1)
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n")
    assert prefs.load_preference_rows(str(path)) == [{"prompt": "a", "chosen": "b", "rejected": "c"}]


# --------------------------------------------------------------------------- validation


def test_ranked_rows_are_ordered_best_first():
    g = prefs.parse_preference_row({"prompt": "p", "completions": ["a", "b", "c"], "ranking": [2, 0, 1]}, "row 1")
    assert g.completions == ("c", "a", "b") and g.scores is None
    g = prefs.parse_preference_row({"prompt": "p", "completions": ["a", "b", "c"], "scores": [0.5, 2, -1]}, "row 1")
    assert g.completions == ("b", "a", "c") and g.scores == (2.0, 0.5, -1.0)
    g = prefs.parse_preference_row(
        {"prompt": "p", "chosen": "a", "rejected": "b", "chosen_score": 5, "rejected_score": 2}, "row 1"
    )
    assert g.completions == ("a", "b") and g.margin == 3.0  # Llama 2 margin: rating gap 5 - 2
    g = prefs.parse_preference_row({"prompt": "p", "chosen": "a", "rejected": "b", "margin": 0.5}, "row 1")
    assert g.margin == 0.5


def test_messages_rows_split_the_shared_prompt():
    user = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}]
    row = {
        "chosen": user + [{"role": "assistant", "content": "4"}],
        "rejected": user + [{"role": "assistant", "content": "5"}],
    }
    g = prefs.parse_preference_row(row, "row 1")
    assert g.prompt == user
    assert g.completions == ([{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}])


def test_to_pairs_all_and_best_worst():
    g = prefs.parse_preference_row({"prompt": "p", "completions": ["a", "b", "c"], "scores": [3, 2, 1]}, "row 1")
    pairs = prefs.to_pairs([g])
    assert [p.completions for p in pairs] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert [p.margin for p in pairs] == [1.0, 2.0, 1.0]
    assert [p.completions for p in prefs.to_pairs([g], "best_worst")] == [("a", "c")]


USER = {"role": "user", "content": "2+2="}
ASSIST = {"role": "assistant", "content": "4"}


@pytest.mark.parametrize(
    "row, message",
    [
        (
            {"prompt": "p", "chosen": "a"},
            r"row 2 of d\.jsonl: preference rows need `chosen` and `rejected` \(missing \['rejected'\]",
        ),
        ({"prompt": "p", "answer": "a"}, r"missing \['chosen', 'rejected'\]; found columns \['answer', 'prompt'\]"),
        ({"prompt": "p", "chosen": "same", "rejected": "same"}, "row 2 of d.jsonl: chosen and rejected are identical"),
        ({"prompt": "p", "chosen": "a", "rejected": ""}, r"row 2 of d\.jsonl \(rejected\): empty completion"),
        ({"prompt": "p", "chosen": None, "rejected": "b"}, "`chosen` is missing"),
        (
            {"prompt": "p", "completions": ["a", "b", "c"], "ranking": [0, [1, 2]]},
            r"`ranking` has tied completions \[1, 2\]",
        ),
        ({"prompt": "p", "completions": ["a", "b", "c"], "ranking": [2, 0]}, r"exactly once; missing \[1\]"),
        ({"prompt": "p", "completions": ["a", "b", "c"], "ranking": [2, 0, 0]}, r"missing \[1\], repeated \[0\]"),
        ({"prompt": "p", "completions": ["a", "b", "c"], "ranking": [0, 1, 5]}, r"indices in 0\.\.2"),
        ({"prompt": "p", "completions": ["a", "b", "c"], "scores": [1, 2, 1]}, "completions 0 and 2 are tied"),
        ({"prompt": "p", "completions": ["a"], "scores": [1]}, ">= 2 completions"),
        ({"completions": ["a", "b"], "scores": [1, 2]}, "ranked rows need a `prompt`"),
        (
            {"chosen": [USER, ASSIST], "rejected": [{"role": "user", "content": "3+3="}, ASSIST]},
            r"different prompts .* differ at message 0: chosen '2\+2=' vs rejected '3\+3='",
        ),
        (
            {"chosen": [USER, ASSIST], "rejected": [{"role": "system", "content": "x"}, USER, ASSIST]},
            "differ at message 0",
        ),
        ({"chosen": [USER, ASSIST], "rejected": [ASSIST]}, r"row 2 of d\.jsonl \(rejected\): bad role order"),
        ({"prompt": "p", "chosen": "a", "rejected": "b", "margin": "big"}, "margin must be a finite number"),
    ],
    ids=[
        "missing-rejected",
        "missing-both",
        "identical",
        "empty",
        "null",
        "ranking-tie",
        "ranking-missing",
        "ranking-repeated",
        "ranking-range",
        "scores-tie",
        "one-completion",
        "ranked-no-prompt",
        "messages-prefix-mismatch",
        "messages-prefix-length",
        "messages-bad-roles",
        "bad-margin",
    ],
)
def test_bad_preference_rows_name_the_row(row, message):
    good = {"prompt": "p", "chosen": "a", "rejected": "b"}
    with pytest.raises(ValueError, match=message):
        prefs.parse_preference_rows([good, row], "d.jsonl")


def test_bad_labelled_and_step_rows():
    with pytest.raises(ValueError, match=r"row 1 of x: label must be one of \[0, 1\] or a bool, got 2"):
        prefs.parse_labelled_rows([{"prompt": "p", "completion": "c", "label": 2}], "x")
    with pytest.raises(ValueError, match="need columns prompt, completion, label"):
        prefs.parse_labelled_rows([{"prompt": "p", "completion": "c"}], "x")
    assert prefs.parse_labelled_rows([{"prompt": "p", "completion": "c", "label": True}], "x")[0].label == 1
    with pytest.raises(ValueError, match="one label each"):
        prefs.parse_step_rows([{"prompt": "p", "completions": ["a", "b"], "labels": [1]}], "x")
    with pytest.raises(ValueError, match="step 1 must be non-empty text without"):
        prefs.parse_step_rows([{"prompt": "p", "completions": ["a", "b\nc"], "labels": [1, 1]}], "x")
    with pytest.raises(ValueError, match=r"label of step 0 must be one of \[-1, 0, 1\]"):
        prefs.parse_step_rows([{"prompt": "p", "completions": ["a"], "labels": [2]}], "x")
    (ex,) = prefs.parse_step_rows([{"prompt": "p", "completions": [" a ", "b"], "labels": [True, False]}], "x")
    assert ex.completion == "a\nb" and ex.label == (1, -1) and ex.steps == ("a", "b")


# --------------------------------------------------------------------------- tokenisation


def test_tokenize_matches_generation_layout(tok):
    t = prefs.tokenize(tok, "12+34=", "46", chat=True)
    # prompt = the rendered generation prompt; completion = the answer then <|im_end|> (what a policy generates)
    assert list(t.prompt_ids) == tok(render_prompt(tok, "12+34="), add_special_tokens=False)["input_ids"]
    assert list(t.completion_ids) == tok("46", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert t.learn == (1, 1, 1) and len(t) == len(t.prompt_ids) + 3
    raw = prefs.tokenize(tok, "12+34=", "46", chat=False)
    assert tok.decode(list(raw.prompt_ids)) == "12+34=" and raw.completion_ids[-1] == tok.eos_token_id


def test_tokenize_multi_turn_completion_masks_the_user_turn(tok):
    completion = [
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "5"},
    ]
    t = prefs.tokenize(tok, "2+2=", completion, chat=True)
    text = tok.decode(list(t.completion_ids))
    assert text.startswith("4<|im_end|>") and text.endswith("5<|im_end|>")
    learned = tok.decode([i for i, m in zip(t.completion_ids, t.learn) if m])
    assert learned == "4<|im_end|>5<|im_end|>"


def test_step_positions_point_at_the_last_character_of_each_step(tok):
    steps = ["12+3=15", "15-4=11"]
    t = prefs.tokenize(tok, "12+3-4=", "\n".join(steps), chat=True)
    # "12+3=15\n15-4=11": step 1 ends at character 6, step 2 at character 8 + 6 = 14 (char tokenizer: token = char)
    assert prefs.step_positions(tok, t, steps) == [6, 14]


def test_collate_sequences_and_completions_by_hand():
    a = prefs.Tokenized((1, 2), (3, 4, 5), (1, 1, 1))
    b = prefs.Tokenized((6, 7, 8), (9,), (1,))
    s = prefs.collate_sequences([a, b], pad_id=0)
    assert s["input_ids"].tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert s["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert s["learn"].tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 1, 0]]
    c = prefs.collate_completions([a, b], pad_id=0)
    # prompts left-padded to P = 3, completions right-padded to T = 3
    assert c["input_ids"].tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 0, 0]]
    assert c["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    assert c["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert int(c["completion_start"]) == 3
    assert c["completion_mask"].dtype == torch.float32


def test_conversational_prompt_and_completions(tok):
    row = {
        "prompt": [{"role": "user", "content": "2+2="}],
        "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "5"}],
    }
    g = prefs.parse_preference_row(row, "row 1")
    assert prefs.tokenize(tok, g.prompt, g.completions[0]) == prefs.tokenize(tok, "2+2=", "4")


def test_completion_rows_and_export(tmp_path):
    """`lmrl prefs` writes a built-in source as JSONL (the SFT rows of a DPO reference policy: sft/tiny_prefs)."""
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "q", "completions": ["c", "d", "e"]}]
    assert prefs.completion_rows(rows) == [{"prompt": "p", "completion": c} for c in "ab"] + [
        {"prompt": "q", "completion": c} for c in "cde"
    ]
    assert prefs.export_rows("builtin:prefs-sft", str(tmp_path / "s.jsonl"), n=5, seed=1) == 10
    written = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    pairs = prefs.preference_rows(5, seed=1)
    assert written == prefs.completion_rows(pairs)
    assert main(["prefs", "builtin:prm", f"output_file={tmp_path / 'p.jsonl'}", "prompts=3", "split=test"]) == 0
    assert [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()] == prefs.prm_rows(3, "test")
