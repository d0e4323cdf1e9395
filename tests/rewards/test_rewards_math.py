"""Tests of the `math` reward (math-verify) and its answer extraction."""

import threading

import pytest

import lmrl.rewards.math_verifier as mv
from lmrl.rewards import MissingColumnError, extract_answer, last_boxed, make_reward, math_score


def score(completions, answers):
    fn = make_reward("math")
    return fn(["q"] * len(completions), completions, answer=answers), fn.last_stats


def test_last_boxed_balances_braces_and_takes_the_last_complete_box():
    assert last_boxed(r"so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{1} then \boxed {2}") == "2"
    # The last box is cut off (no closing brace): the previous complete one is used.
    assert last_boxed(r"\boxed{3} and \boxed{4") == "3"
    assert last_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"
    assert last_boxed("no box here 7") is None


def test_extract_answer_prefers_the_box_then_the_last_number():
    assert extract_answer(r"3 apples, \boxed{5}, then 9") == r"\boxed{5}"
    assert extract_answer("I had 3 apples and then 12.") == "12"
    assert extract_answer("total: 1,234 dollars") == "1234"
    assert extract_answer("it is -3.5 or 1/2") == "1/2"
    assert extract_answer("x = -3.5.") == "-3.5"
    assert extract_answer(r"\boxed{ }") is None  # an empty box is no answer
    assert extract_answer("no digits") is None


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"The answer is \boxed{1/2}", "0.5", 1.0),  # 1/2 == 0.5
        (r"\boxed{\frac{3}{4}}", "0.75", 1.0),  # LaTeX fraction 3/4 == 0.75
        (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", 1.0),  # \dfrac normalised to \frac
        ("so x equals 0.5", r"\frac{1}{2}", 1.0),  # last number 0.5 vs LaTeX gold
        (r"\boxed{\sqrt{2}}", r"\sqrt{2}", 1.0),  # bare LaTeX gold, re-parsed inside $...$
        ("we get 1,000 in total", "1000", 1.0),  # thousands separator dropped
        (r"first \boxed{1}, finally \boxed{2}", "2", 1.0),  # the last box counts
        (r"\boxed{2/3}", "0.5", 0.0),  # wrong: 2/3 != 1/2
        ("I had 3 apples and then 12", "3", 0.0),  # the last number (12) is the answer
    ],
)
def test_math_reward_on_crafted_completions(completion, gold, expected):
    rewards, stats = score([completion], [gold])
    assert rewards == [expected]
    assert stats == {"errors": 0.0, "no_answer": 0.0}


def test_garbage_completions_get_zero_and_are_counted_as_no_answer():
    rewards, stats = score(["blah blah", r"\boxed{", "", r"\boxed{}"], ["1", "1", "1", "1"])
    assert rewards == [0.0, 0.0, 0.0, 0.0]
    assert stats == {"errors": 0.0, "no_answer": 4.0}


def test_unparseable_gold_gives_zero_and_counts_an_error():
    reward, status = math_score(r"\boxed{1}", "")
    assert reward == 0.0 and status.startswith("error") and "gold" in status


def test_math_verify_exceptions_give_zero_and_are_counted(monkeypatch):
    from math_verify.errors import TimeoutException

    def boom(*args, **kwargs):
        raise RuntimeError("sympy exploded")

    monkeypatch.setattr(mv, "verify", boom)
    rewards, stats = score([r"\boxed{1}", "no answer"], ["1", "1"])
    assert rewards == [0.0, 0.0]
    assert stats == {"errors": 1.0, "no_answer": 1.0}

    def slow(*args, **kwargs):
        raise TimeoutException("Operation timed out!")  # a BaseException in math-verify

    monkeypatch.setattr(mv, "verify", slow)
    rewards, stats = score([r"\boxed{1}"], ["1"])
    assert rewards == [0.0] and stats["errors"] == 1.0


def test_timeout_is_used_in_the_main_thread_and_disabled_elsewhere(monkeypatch):
    seen = []
    real_parse = mv.parse

    def spy(*args, **kwargs):
        seen.append(kwargs["parsing_timeout"])
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(mv, "parse", spy)
    assert score([r"\boxed{1/2}"], ["0.5"])[0] == [1.0]
    assert set(seen) == {5}
    seen.clear()
    out = {}
    worker = threading.Thread(target=lambda: out.update(r=score([r"\boxed{1/2}"], ["0.5"])))
    worker.start()
    worker.join()
    # math-verify's signal.alarm would raise outside the main thread; with the timeout off it verifies.
    assert out["r"] == ([1.0], {"errors": 0.0, "no_answer": 0.0})
    assert set(seen) == {None}


def test_math_reward_needs_the_answer_column_and_a_valid_timeout():
    with pytest.raises(MissingColumnError, match="'answer'"):
        make_reward("math")(["q"], ["1"])
    with pytest.raises(ValueError, match="timeout_s"):
        make_reward("math", timeout_s=0)


def test_without_math_verify_the_math_reward_stops_at_start_up_naming_the_fix(monkeypatch):
    # lmrl imports without math-verify (benchmarks/gpu_check.py runs on images that lack it); only `math` needs it
    monkeypatch.setattr(mv, "_IMPORT_ERROR", ImportError("No module named 'math_verify'"))
    with pytest.raises(ImportError, match="pip install 'math-verify"):
        make_reward("math")
    with pytest.raises(ImportError, match="math-verify"):
        math_score(r"\boxed{1}", "1")
