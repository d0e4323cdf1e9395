"""Tests of the `exact_match` and `format` rewards."""

import pytest

from lmrl.rewards import MissingColumnError, make_reward


def test_exact_match_strips_and_optionally_casefolds():
    completions = [" Paris \n", "paris", "Paris.", "Lyon"]
    answers = ["Paris", "Paris", "Paris", "Paris"]
    # strip(" Paris \n") == "Paris" -> 1; "paris" != "Paris" -> 0; "Paris." != "Paris" -> 0; "Lyon" -> 0
    assert make_reward("exact_match")(["q"] * 4, completions, answer=answers) == [1.0, 0.0, 0.0, 0.0]
    # case-folded: "paris" == "paris" -> 1
    assert make_reward("exact_match", ignore_case=True)(["q"] * 4, completions, answer=answers) == [1.0, 1.0, 0.0, 0.0]


def test_exact_match_ignores_unknown_columns_and_needs_answer():
    fn = make_reward("exact_match")
    assert fn(["q"], ["7"], answer=["7"], truncated=[False], completion_lengths=[1], meta=[{}]) == [1.0]
    with pytest.raises(MissingColumnError, match="exact_match"):
        fn(["q"], ["7"])
    with pytest.raises(ValueError, match="one value per completion"):
        fn(["q", "q"], ["7", "8"], answer=["7"])


def test_default_format_pattern():
    fn = make_reward("format")
    completions = [
        "<think>step 1\nstep 2</think>\n<answer>4</answer>",  # newlines inside think (DOTALL) -> 1
        "<think>a</think><answer>4</answer>",  # no whitespace between blocks is fine -> 1
        "<answer>4</answer>",  # no think block -> 0
        "<think>a</think><answer>4</answer> extra",  # text after </answer> -> 0
        "intro <think>a</think><answer>4</answer>",  # text before <think> -> 0
    ]
    assert fn(["q"] * 5, completions) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_format_options():
    multiline = "<think>a\nb</think><answer>4</answer>"
    assert make_reward("format", dotall=False)(["q"], [multiline]) == [0.0]  # '.' stops at '\n'
    contains_box = make_reward("format", pattern=r"\\boxed\{")  # unanchored: "contains"
    assert contains_box(["q", "q"], [r"so \boxed{3}", "3"]) == [1.0, 0.0]
    assert make_reward("format").__name__ == "format"
    with pytest.raises(ValueError, match="not a valid regular expression"):
        make_reward("format", pattern="(unclosed")
