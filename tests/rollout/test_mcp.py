"""MCP tools over stdio, against a tiny server this test starts (tests/rollout/mcp_server.py)."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is the `tools` extra (make install installs it)")

from lmrl.rollout.tools.env import ToolEnv  # noqa: E402
from lmrl.rollout.tools.mcp import _OPEN, MCPConnection, mcp_tools, server_command  # noqa: E402
from lmrl.rollout.tools.parsers import ToolCall, get_parser  # noqa: E402
from lmrl.rollout.tools.toolbox import ToolBox  # noqa: E402

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_server.py"))]


@pytest.fixture(scope="module")
def conn():
    connection = MCPConnection(SERVER)
    yield connection
    connection.close()


def test_server_tools_are_listed_with_their_json_schema(conn):
    tools = {t.name: t for t in conn.tools()}
    assert set(tools) == {"add", "fail"}
    schema = tools["add"].schema()["function"]
    assert schema["description"] == "Add two integers."
    assert schema["parameters"]["required"] == ["a", "b"]
    assert schema["parameters"]["properties"]["a"]["type"] == "integer"


def test_a_call_round_trips_and_errors_become_observations(conn):
    box = ToolBox(conn.tools())
    assert box.execute(ToolCall("add", {"a": 2, "b": 40})).content == "42"
    failed = box.execute(ToolCall("fail", {"reason": "nope"}))
    assert failed.error is not None and failed.content.startswith("Error: tool 'fail' raised")
    assert "must be of type integer" in box.execute(ToolCall("add", {"a": "x", "b": 1})).error


def test_the_tool_environment_calls_the_server(conn):
    env = ToolEnv(ToolBox(conn.tools()), get_parser("json"))
    result = env.step({"role": "assistant", "content": '{"name": "add", "arguments": {"a": 1, "b": 2}}'})
    assert result.observations[0]["content"] == "3" and not result.done and env.stats["calls"] == 1


def test_a_server_that_does_not_start_fails_clearly():
    with pytest.raises(ValueError, match="did not start"):
        MCPConnection([sys.executable, "-c", "import sys; sys.exit(3)"], timeout_s=20)


def test_a_dying_server_is_named_with_its_stderr_not_an_exception_group():
    crash = "import sys; print('ModuleNotFoundError: no module named mcp_demo', file=sys.stderr); sys.exit(3)"
    with pytest.raises(ValueError) as err:
        MCPConnection([sys.executable, "-c", crash], timeout_s=20)
    message = str(err.value)
    assert "did not start" in message and "-c" in message and "no module named mcp_demo" in message
    assert "ExceptionGroup" not in message and "TaskGroup" not in message


def test_python_is_lmrl_s_interpreter_without_an_activated_venv(conn, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no `python` on PATH at all
    assert server_command(f"python {SERVER[1]}") == SERVER
    open_before = list(_OPEN)
    assert {t.name for t in mcp_tools(["python", SERVER[1]])} == {"add", "fail"}
    assert _OPEN == open_before  # the running server is reused: started once, before the model loads


@pytest.mark.parametrize(
    "line, match",
    [
        ("nosuchprogram serve", "'nosuchprogram' is not a program on PATH"),
        ("python no_such_server.py", "'no_such_server.py' does not exist"),
        ("python 'unclosed", "not a command line"),
        ("", "empty"),
    ],
)
def test_bad_server_commands_fail_when_the_config_is_read(line, match):
    from lmrl.config import ConfigError, load_config
    from lmrl.eval.cli import EvalConfig

    with pytest.raises(ConfigError, match=match):
        load_config(EvalConfig, None, ["tools=[]", f"mcp_servers={json.dumps([line])}"])


def test_a_server_that_dies_stops_lmrl_eval_before_the_model_loads(monkeypatch, tmp_path):
    from lmrl.config import ConfigError, load_config
    from lmrl.eval import cli as eval_cli
    from lmrl.models.setup import ModelSetup

    monkeypatch.setattr(ModelSetup, "policy", lambda *a, **k: pytest.fail("the model loaded before the check"))
    config = load_config(
        eval_cli.EvalConfig,
        None,
        [
            "mcp_servers=[\"python -c 'import sys; sys.exit(4)'\"]",
            "dataset=task:tool_arithmetic",
            "rows=2",
            f"output_file={tmp_path / 'e.json'}",
        ],
    )
    with pytest.raises(ConfigError, match="mcp_servers: MCP server .*did not start"):
        eval_cli.run(config)
