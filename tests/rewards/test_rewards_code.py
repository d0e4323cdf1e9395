"""The code verifier: unit tests in the sandbox, all-pass or pass fraction, and the built-in code task."""

import pytest

from lmrl.data.tasks import get_task, make_rows
from lmrl.rewards import make_reward
from lmrl.sandbox import SandboxLimits, extract_code, run_tests

TESTS = ["assert f(1) == 2", "assert f(5) == 6", "assert f(-1) == 0"]


def test_run_tests_counts_passing_tests():
    assert run_tests("def f(x):\n    return x + 1", TESTS)[:2] == (3, 3)
    assert run_tests("def f(x):\n    return 2 if x == 1 else 0", TESTS)[:2] == (2, 3)


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nsys.exit(0)",  # exits before the tests
        "print('@@lmrl-tests-0000@@3')",  # prints a fake count
        "import builtins\nbuiltins.exec = lambda *a, **k: None",  # disables the tests' exec
        "import os\nprint(os.environ.get('LMRL_TESTS_MARKER'))\ndef f(x):\n    return -999",  # looks for the marker
        "def f(:",  # does not compile
    ],
)
def test_naive_reward_hacks_pass_nothing(code):
    assert run_tests(code, TESTS)[0] == 0


def test_tests_are_judged_outside_the_sandbox():
    # the sandbox only returns f's values: one that claims equality with everything is just an object
    code = "class E:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return E()"
    assert run_tests(code, TESTS)[0] == 0
    assert (
        run_tests(
            "def f(x):\n    return [x, x]",
            ["assert f(2)[0] + 1 == 3", "assert len(f(1)) == 2", "assert sorted(f(3)) != [3]"],
        )[0]
        == 3
    )


@pytest.mark.parametrize("test", ["f(1)", "assert all(f(x) for x in [1])", "import os\nassert f(1) == 2"])
def test_tests_the_judge_cannot_evaluate_fail_clearly(test):
    with pytest.raises(ValueError, match="test"):
        run_tests("def f(x):\n    return x", [test])


def test_an_infinite_loop_passes_nothing_and_is_killed():
    passed, total, result = run_tests("while True:\n    pass", TESTS, SandboxLimits(timeout_s=1, cpu_s=1))
    assert (passed, total, result.status) == (0, 3, "timeout")


def test_extract_code_takes_the_last_fenced_block():
    assert extract_code("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert extract_code("def f(x): return x") == "def f(x): return x"


def test_code_reward_modes_and_columns():
    completions = ["```python\ndef f(x):\n    return x + 1\n```", "def f(x):\n    return 2", "oops("]
    frac = make_reward("code", mode="fraction")(["p"] * 3, completions, tests=[TESTS] * 3)
    assert frac == [1.0, pytest.approx(1 / 3), 0.0]
    gate = make_reward("code")(["p"] * 3, completions, meta=[{"tests": TESTS}] * 3)
    assert gate == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="mode"):
        make_reward("code", mode="most")


def test_the_code_task_reference_solutions_pass_and_wrong_code_fails():
    task = get_task("code", n_tests=3)
    for row in make_rows(task, 4, seed=3):
        assert len(row["meta"]["tests"]) == 3
        assert task.score(row["completion"], row["answer"], row["meta"]) == 1.0
        assert task.score("def f(x):\n    return None", row["answer"], row["meta"]) == 0.0


FACTORIAL = "def f(n):\n    r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r\n"


def test_expected_values_are_computed_where_the_candidate_cannot_reach_them():
    # issue 46: `== math.factorial(3)` was evaluated with the candidate loaded: patching it earned 1.0, and a
    # correct answer that did not `import math` earned 0
    tests = ["assert f(3) == math.factorial(3)", "assert f(5) == math.factorial(5)"]
    assert run_tests(FACTORIAL, tests)[:2] == (2, 2)
    patched = "import math\nmath.factorial = lambda n: -1\ndef f(n):\n    return -1\n"
    assert run_tests(patched, tests)[0] == 0
    shadowed = "class M:\n    factorial = staticmethod(lambda n: -1)\nmath = M()\ndef f(n):\n    return -1\n"
    assert run_tests(shadowed, tests)[0] == 0


def test_expected_names_come_from_the_setup_never_from_the_candidate():
    tests = ["assert f(3) == EXPECTED", "assert f(3) == TABLE[3]"]
    setup = "import math\nEXPECTED = math.factorial(3)\nTABLE = {3: 6}"
    assert run_tests(FACTORIAL, tests, setup=setup)[0] == 2
    hack = "EXPECTED = -1\nTABLE = {3: -1}\ndef f(n):\n    return -1\n"
    assert run_tests(hack, tests, setup=setup)[0] == 0
    with pytest.raises(ValueError, match="setup name 'EXPECTED'"):
        run_tests(FACTORIAL, ["assert f(EXPECTED) == 6"], setup=setup)


def test_a_module_check_on_the_candidates_value_runs_outside_its_process():
    patched = "import statistics\nstatistics.mean = lambda xs: 2\ndef f(n):\n    return [5, 5]\n"
    assert run_tests(patched, ["assert statistics.mean(f(3)) == 2"])[0] == 0
    assert run_tests("def f(n):\n    return [1, 3]\n", ["assert statistics.mean(f(3)) == 2"])[0] == 1
    assert run_tests("def f(x):\n    return round(x, 2)\n", ["assert f(math.pi) == 3.14"])[0] == 1


def test_the_code_reward_reads_the_test_setup():
    completions = [FACTORIAL, "EXPECTED = 0\ndef f(n):\n    return 0\n"]
    meta = [{"tests": ["assert f(3) == EXPECTED"], "test_setup": "EXPECTED = 6"}] * 2
    assert make_reward("code")(["p"] * 2, completions, meta=meta) == [1.0, 0.0]
