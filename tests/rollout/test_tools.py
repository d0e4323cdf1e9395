"""Tools: the calculator's arithmetic, and every way a call can fail becomes an error observation."""

import pytest

from lmrl.rollout.tools.parsers import ToolCall
from lmrl.rollout.tools.toolbox import Tool, ToolBox, build_tools, calculate, calculator, python_tool


@pytest.mark.parametrize(
    "expr, value",
    [
        ("4821*937", "4517277"),
        ("2**10 - (3+4)*5", "989"),
        ("7/2", "3.5"),
        ("10/4*2", "5"),
        ("-3 // 2", "-2"),
        ("17 % 5", "2"),
        ("0.1+0.2", "0.3"),
        ("99999*99999", str(99999 * 99999)),
    ],
)
def test_calculator_is_exact(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize(
    "expr, reason",
    [
        ("__import__('os')", "unsupported"),
        ("1/0", "division by zero"),
        ("9**9**9", "too large"),
        ("2 +", "not an arithmetic"),
        ("", "give an"),
        ("(((1/3)**1000)**1000)**1000", "too large"),
        ("(1/7)**999", "too large"),
        ("1e308*1e308", "too large"),
        ("10**201", "too large"),
        ("x + 1", "unsupported"),
    ],
)
def test_calculator_refuses_anything_else(expr, reason):
    with pytest.raises(ValueError, match=reason):
        calculate(expr)


def raising(**kwargs):
    raise RuntimeError("tool exploded")


BOX = ToolBox(
    [
        calculator(),
        Tool("boom", "raises", {"type": "object", "properties": {}}, raising),
        Tool("big", "prints a lot", {"type": "object", "properties": {}}, lambda: "x" * 50),
    ],
    max_output_chars=20,
)


def test_a_good_call_returns_the_value():
    assert BOX.execute(ToolCall("calculator", {"expression": "6*7"})).content == "42"


@pytest.mark.parametrize(
    "call, reason",
    [
        (
            ToolCall("calculater", {"expression": "1"}),
            "unknown tool 'calculater'; the tools are ['big', 'boom', 'calculator']. Did you mean 'calculator'?",
        ),
        (ToolCall("calculator", {}), "missing required argument(s) ['expression']"),
        (ToolCall("calculator", {"expression": "1", "x": 2}), "unknown argument(s) ['x']"),
        (ToolCall("calculator", {"expression": 12}), "must be of type string, got int"),
        (ToolCall("calculator", {"expression": "1/0"}), "raised ValueError: division by zero"),
        (ToolCall("boom", {}), "tool 'boom' raised RuntimeError: tool exploded"),
    ],
)
def test_failures_become_error_observations(call, reason):
    result = BOX.execute(call)
    assert result.error is not None and reason in result.error and result.content.startswith("Error: ")


def test_a_hung_tool_is_an_error_not_a_hung_loop():
    import threading

    release = threading.Event()
    box = ToolBox(
        [Tool("hang", "never answers", {"type": "object", "properties": {}}, lambda: release.wait(30))], timeout_s=0.2
    )
    result = box.execute(ToolCall("hang", {}))
    release.set()
    assert result.error == "tool 'hang' did not answer within 0.2 s"


def test_long_output_is_cut_with_a_marker_and_flagged():
    result = BOX.execute(ToolCall("big", {}))
    assert result.truncated and result.error is None
    assert result.content == "x" * 20 + "\n...[truncated 30 characters]"


def test_the_python_tool_runs_in_the_sandbox():
    tool = python_tool(timeout_s=2)
    assert tool.fn(code="print(sum(range(10)))") == "45"
    assert "time limit" in tool.fn(code="while True: pass")


def test_schemas_are_openai_functions():
    schema = calculator().schema()
    assert schema["type"] == "function" and schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]


def test_build_tools_checks_names_and_options():
    assert [t.name for t in build_tools(["calculator", "python"], {"python": {"timeout_s": 1}})] == [
        "calculator",
        "python",
    ]
    with pytest.raises(ValueError, match="Did you mean 'calculator'"):
        build_tools(["calculater"])
    with pytest.raises(ValueError, match="tool_kwargs.python"):
        build_tools(["python"], {"python": {"nope": 1}})
    with pytest.raises(ValueError, match="not in tools"):
        build_tools(["calculator"], {"python": {}})
    with pytest.raises(ValueError, match="given twice"):
        ToolBox([calculator(), calculator()])
