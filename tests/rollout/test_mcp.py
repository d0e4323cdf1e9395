"""MCP tools over stdio, against a tiny server this test starts (tests/rollout/mcp_server.py)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is the `tools` extra (make install installs it)")

from lmrl.rollout.env import ToolEnv  # noqa: E402
from lmrl.rollout.mcp_tools import MCPConnection  # noqa: E402
from lmrl.rollout.tool_parsers import ToolCall, get_parser  # noqa: E402
from lmrl.rollout.tools import ToolBox  # noqa: E402

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
