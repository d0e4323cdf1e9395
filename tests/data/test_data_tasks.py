"""Built-in task families: generation, canonical completions, verifiers, splits, registry."""

import json
import random
import re
from fractions import Fraction

import pytest

from lmrl.data.tasks import TASKS, extract_answer, get_task, make_rows, split_of
from lmrl.data.tasks.expr import evaluate, render, tree_value

GARBAGE = [
    "",
    " ",
    "\n\t",
    "\x00\x01",
    "<answer></answer>",
    "\\boxed{}",
    "__import__('os').system('ls')",
    "9" * 5000,
    "(" * 500 + "1" + ")" * 500,
    "1/0",
    "1" + "*1" * 150,
    "∞",
    "²",
    "٣",
    "None",
    "[]",
    "x=",
    "-",
    "+-1",
    "1 2 3",
    "sort",
    "<answer>",
    "(((",
    "lambda: 0",
    "0x10",
    "1e9",
    "True",
]


def wrong(task_name, ex):
    """A completion that parses but is wrong, built per family."""
    if task_name in ("arithmetic", "count", "linear"):
        return str(int(ex.answer) + 1)
    if task_name == "countdown":
        return ex.answer + "+1"  # value changes by 1 (and may use an unavailable 1)
    if task_name == "sorting":
        parts = ex.answer.split()
        i = next((i for i in range(len(parts) - 1) if parts[i] != parts[i + 1]), None)
        if i is None:
            return None
        parts[i], parts[i + 1] = parts[i + 1], parts[i]
        return " ".join(parts)
    if task_name == "reverse":
        return None if ex.meta["word"] == ex.answer else ex.meta["word"]
    if task_name == "tool_arithmetic":
        return str(int(ex.answer) + 1)
    if task_name == "code":
        return "def f(x):\n    return None"
    raise AssertionError(task_name)


SAMPLES = {"code": 4}
"""Problems drawn per task in the round trip (code runs each completion in the sandbox: a few suffice)."""


@pytest.mark.parametrize("name", sorted(TASKS))
def test_round_trip_wrong_and_garbage(name):
    task = get_task(name)
    rng = random.Random(123)
    n_wrong, n = 0, SAMPLES.get(name, 200)
    for _ in range(n):
        ex = task.sample(rng)
        assert ex.task == name and ex.prompt and ex.answer
        json.dumps(ex.meta)  # JSON-serialisable
        assert task.score(task.completion(ex), ex.answer, ex.meta) == 1.0
        assert task.score("  " + task.completion(ex) + "\n", ex.answer, ex.meta) == 1.0
        assert task.score(f"<answer>{task.completion(ex)}</answer>", ex.answer, ex.meta) == 1.0
        bad = wrong(name, ex)
        if bad is not None:
            n_wrong += 1
            assert task.score(bad, ex.answer, ex.meta) == 0.0, (ex, bad)
        for g in GARBAGE:
            assert task.score(g, ex.answer, ex.meta) in (0.0, 1.0)
    assert n_wrong > 0.75 * n
    for g in GARBAGE:  # garbage against garbage answers and meta never raises
        assert task.score(g, g, {}) in (0.0, 1.0)
        assert task.score(g, "", {"numbers": "x", "target": None}) == 0.0 or name != "countdown"
    assert task.score(None, "1", {}) == 0.0


def test_arithmetic_hand_cases():
    t = get_task("arithmetic")
    assert t.score("46", "46", {}) == 1.0
    assert t.score(" 46\n", "46", {}) == 1.0
    assert t.score("\\boxed{46}", "46", {}) == 1.0
    assert t.score("The answer is <answer> 46 </answer>.", "46", {}) == 1.0
    assert t.score("046", "46", {}) == 1.0  # compared as integers
    assert t.score("-22", "-22", {}) == 1.0
    assert t.score("45", "46", {}) == 0.0
    assert t.score("46 apples", "46", {}) == 0.0
    assert t.score("4 6", "46", {}) == 0.0
    assert t.parse("x") is None


def test_arithmetic_formats_and_options():
    rng = random.Random(0)
    t = get_task("arithmetic", digits=2, ops="+-")
    for _ in range(200):
        ex = t.sample(rng)
        m = re.fullmatch(r"(\d{1,2})([+-])(\d{1,2})=", ex.prompt)
        assert m, ex.prompt
        a, op, b = int(m[1]), m[2], int(m[3])
        assert int(ex.answer) == (a + b if op == "+" else a - b)
    t = get_task("arithmetic", ops="/", negative=False)
    for _ in range(100):
        ex = t.sample(rng)
        a, b = map(int, ex.prompt[:-1].split("/"))
        assert b != 0 and a == b * int(ex.answer)
    t = get_task("arithmetic", ops="+-*", n_operands=3, negative=False)
    for _ in range(100):
        ex = t.sample(rng)
        assert int(ex.answer) >= 0 and len(re.findall(r"[+\-*]", ex.prompt)) == 2
    with pytest.raises(ValueError, match="ops must be a non-empty subset"):
        get_task("arithmetic", ops="+^")


def test_arithmetic_chat_style_asks_a_question_and_scores_the_last_number():
    plain, chat = (make_rows(get_task("arithmetic", digits=2, **args), 50, seed=3) for args in ({}, {"style": "chat"}))
    assert all(r["meta"] == {"expression": r["prompt"][:-1]} for r in plain)  # the default rows are unchanged
    for row in chat:
        expression = row["meta"]["expression"]
        assert row["prompt"] == f"What is {expression}? Answer with the number only."
        assert row["meta"]["style"] == "chat" and row["completion"] == row["answer"]
        assert int(row["answer"]) == eval(expression)  # noqa: S307 - digits and +/- only
    t, meta = get_task("arithmetic"), {"expression": "3+4", "style": "chat"}  # re-scored from the row alone
    for ok in ["7", "3 + 4 = 7", "The answer is 7.", "3 + 4 = 7.0", "<answer>7</answer>", "Sum: 0,007"]:
        assert t.score(ok, "7", meta) == 1.0, ok
    for bad in ["3 + 4 = 8", "seven", "", "7 or 8", "7.5", "3+4"]:
        assert t.score(bad, "7", meta) == 0.0, bad
    assert t.score("12-54 = -42", "-42", {"style": "chat"}) == 1.0  # a minus after a digit is no sign
    assert t.score("3 + 4 = 7", "7", {"expression": "3+4"}) == 0.0  # plain rows still want the number alone
    with pytest.raises(ValueError, match=r"style must be one of \('plain', 'chat'\)"):
        get_task("arithmetic", style="prose")


def test_eval_verifier_parses_chat_rows_the_chat_way():
    from lmrl.eval.verify import scorer

    row = {"task": "arithmetic", "answer": "7", "meta": {"expression": "3+4", "style": "chat"}}
    assert scorer("auto")("3 + 4 = 7.", row) == ("7", 1.0)  # maj@k votes on the parsed "7"


def test_countdown_verifier():
    t = get_task("countdown")
    meta = {"numbers": [3, 5, 7], "target": 22}
    for ok in ["3*5+7", "(3*5)+7", "7+5*3", " 3 * 5 + 7 ", "3*5+7=22", "<answer>7+3*5</answer>"]:
        assert t.score(ok, "3*5+7", meta) == 1.0, ok
    for bad in [
        "3*5+7+0",  # 0 not given
        "5*5-3",  # 5 used twice
        "3*7+1",  # 1 not given
        "22",  # 22 not given
        "3*5+7*1",
        "3*5+(-7)+14",
        "__import__('os').system('echo hi')",
        "3**2+13",  # power not allowed
        "(3*5)+7.0",  # float literal
        "3*5+7;",
        "3*5",  # wrong value
    ]:
        assert t.score(bad, "3*5+7", meta) == 0.0, bad
    # exact fractions: 8/(3-8/3) = 8/(1/3) = 24 (floats give 23.999999999999993)
    assert t.score("8/(3-8/3)", "", {"numbers": [3, 3, 8, 8], "target": 24}) == 1.0
    # duplicates given may both be used, but not thrice
    assert t.score("3*3+1", "", {"numbers": [1, 3, 3], "target": 10}) == 1.0
    assert t.score("3*3+3-2", "", {"numbers": [2, 3, 3], "target": 10}) == 0.0


def test_countdown_samples_are_solvable_and_well_formed():
    t = get_task("countdown", n_numbers=4, max_number=9, max_target=50)
    rng = random.Random(5)
    for _ in range(200):
        ex = t.sample(rng)
        nums, target = ex.meta["numbers"], ex.meta["target"]
        assert ex.prompt == f"make {target} from " + " ".join(map(str, nums))
        assert len(nums) == 4 and nums == sorted(nums) and all(1 <= x <= 9 for x in nums)
        assert 1 <= target <= 50
        value, literals = evaluate(ex.answer)
        assert value == target and sorted(literals) == nums  # canonical answer uses every number once


def test_expression_evaluator():
    assert evaluate("2*(3+4)") == (Fraction(14), [2, 3, 4])
    assert evaluate("7/2") == (Fraction(7, 2), [7, 2])
    assert evaluate("10-3-2") == (Fraction(5), [10, 3, 2])
    assert evaluate("7-2", ops="+") is None
    for bad in [
        "1/0",
        "2**3",
        "-3",
        "3.0",
        "True",
        "x",
        "0x10",
        "1_0",
        "3//2",
        "abs(3)",
        "(1,2)",
        "",
        "1 +",
        "9" * 201,
    ]:
        assert evaluate(bad) is None, bad


def test_render_minimal_parentheses():
    assert render(("-", 10, ("+", 1, 5))) == "10-(1+5)"
    assert render(("*", ("+", 3, 5), 9)) == "(3+5)*9"
    assert render(("+", ("*", 3, 5), 7)) == "3*5+7"
    assert render(("/", 8, ("*", 2, 2))) == "8/(2*2)"
    assert render(("-", ("-", 9, 3), 2)) == "9-3-2"
    assert render(("+", 1, ("+", 2, 3))) == "1+2+3"
    rng = random.Random(0)
    t = get_task("countdown", n_numbers=5)
    for _ in range(500):  # rendering never changes the value
        tree = t._tree(rng, [rng.randint(1, 9) for _ in range(5)])
        value = tree_value(tree)
        result = evaluate(render(tree))
        assert (result is None) if value is None else result[0] == value


def test_sorting_and_string_tasks_hand_cases():
    s = get_task("sorting")
    assert s.score("1 3 5 9", "1 3 5 9", {}) == 1.0
    assert s.score("[1, 3, 5, 9]", "1 3 5 9", {}) == 1.0
    assert s.score("1 3 5", "1 3 5 9", {}) == 0.0
    assert s.score("1 3 9 5", "1 3 5 9", {}) == 0.0
    ex = get_task("sorting", descending=True).sample(random.Random(1))
    assert ex.prompt.startswith("sort desc ") and ex.answer == " ".join(
        map(str, sorted(ex.meta["numbers"], reverse=True))
    )
    r = get_task("reverse")
    assert r.score("edcba", "edcba", {}) == 1.0 and r.score("abcde", "edcba", {}) == 0.0
    c = get_task("count")
    assert c.score("3", "3", {}) == 1.0 and c.score("three", "3", {}) == 0.0
    rng = random.Random(2)
    for _ in range(200):
        ex = c.sample(rng)
        letter, word = re.fullmatch(r"count (\w) in (\w+)", ex.prompt).groups()
        assert int(ex.answer) == sum(ch == letter for ch in word)
        ex = r.sample(rng)
        assert ex.prompt == "reverse " + ex.answer[::-1]


def test_linear_equations():
    t = get_task("linear")
    assert t.score("x=5", "5", {}) == 1.0 and t.score("x = -5", "-5", {}) == 1.0 and t.score("6", "5", {}) == 0.0
    rng = random.Random(3)
    seen = set()
    for _ in range(300):
        ex = t.sample(rng)
        m = re.fullmatch(r"solve (\d*)x([+-]\d+)?=(-?\d+)", ex.prompt)
        assert m, ex.prompt
        a = int(m[1]) if m[1] else 1
        b = int(m[2]) if m[2] else 0
        assert m[1] != "1" and m[2] != "+0" and m[2] != "-0"  # no redundant symbols
        assert a * int(ex.answer) + b == int(m[3])
        seen.add((m[1] == "", m[2] is None))
    assert seen == {(True, True), (True, False), (False, True), (False, False)}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_make_rows_deterministic_and_disjoint(name):
    task = get_task(name)
    train = make_rows(task, 300, "train", seed=0)
    test = make_rows(task, 30, "test", seed=0)
    assert train == make_rows(task, 300, "train", seed=0)
    assert train != make_rows(task, 300, "train", seed=1)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert not {r["prompt"] for r in make_rows(task, 300, "train", seed=7)} & {r["prompt"] for r in test}
    assert len({r["prompt"] for r in test}) == 30
    assert all(split_of(r["prompt"]) == "train" for r in train)
    assert set(train[0]) - {"messages"} == {"task", "prompt", "completion", "answer", "meta"}  # messages: tool traces
    json.dumps(train + test)
    k = SAMPLES.get(name, 50)
    for r in train[:k] + test[:k]:  # any peer can re-score a row from the registry alone
        assert get_task(r["task"]).score(r["completion"], r["answer"], r["meta"]) == 1.0


def test_make_rows_small_space():
    task = get_task("arithmetic", digits=1, ops="+")  # 100 problems, about 10 of them test
    n_test = sum(split_of(f"{a}+{b}=") == "test" for a in range(10) for b in range(10))
    assert 0 < n_test < 30
    with pytest.raises(ValueError, match=rf"produced only {n_test} unique test problems.*fewer rows"):
        make_rows(task, 50, "test")
    assert len(make_rows(task, n_test, "test")) == n_test
    train = make_rows(task, 500, "train")  # duplicates allowed, still never a test prompt
    assert len(train) == 500 and len({r["prompt"] for r in train}) == 100 - n_test
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        make_rows(task, 5, "val")


def test_split_of_fraction():
    prompts = [f"p{i}" for i in range(20000)]
    frac = sum(split_of(p) == "test" for p in prompts) / len(prompts)
    assert 0.09 < frac < 0.11
    assert split_of("12+34=") == split_of("12+34=")


def test_registry_errors():
    assert set(TASKS) == {"arithmetic", "countdown", "sorting", "reverse", "count", "linear", "tool_arithmetic", "code"}
    with pytest.raises(
        ValueError, match=r"unknown task 'aritmetic'; the tasks are \[.*\]\. Did you mean 'arithmetic'\?"
    ):
        get_task("aritmetic")
    with pytest.raises(
        ValueError,
        match=r"task 'countdown' has no parameter\(s\) \['digits'\]; its parameters are \['n_numbers', 'max_number', 'max_target', 'ops'\]",
    ):
        get_task("countdown", digits=2)


def test_extract_answer():
    assert extract_answer(" <answer>1</answer> then <answer> 2 </answer> ") == "2"
    assert extract_answer("so \\boxed{7} and \\boxed{8}") == "8"
    assert extract_answer("  plain \n") == "plain"


def test_make_rows_allow_fewer_returns_all_unique_test_problems():
    task = get_task("arithmetic", digits=1, ops="+")
    expected = {f"{a}+{b}=" for a in range(10) for b in range(10) if split_of(f"{a}+{b}=") == "test"}
    rows = make_rows(task, 50, "test", allow_fewer=True)
    assert {r["prompt"] for r in rows} == expected and len(rows) == len(expected)
