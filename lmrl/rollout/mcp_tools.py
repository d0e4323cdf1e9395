"""Tools from an MCP server over stdio, through the official `mcp` Python SDK (extra: `pip install 'lmrl[tools]'`).

    tools = mcp_tools(["python", "my_server.py"])     # starts the server, lists its tools
    ToolBox(tools).execute(ToolCall("add", {"a": 2, "b": 3}))        # ToolResult("5")

The SDK is async; the rollout loop is not. One `MCPConnection` runs the client session in a private event loop
on a daemon thread: a single task opens the stdio transport and the session, serves until `close()`, then
closes them (the SDK's transports must be entered and left by the same task). Calls from the loop block on
that thread with a timeout. A tool error reported by the server (`isError`) raises, so `ToolBox` turns it
into an error observation like any other failing tool. Servers are closed at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import sys
import threading
from typing import Any

from lmrl.rollout.tools import Tool

_OPEN: list[MCPConnection] = []


def _require_mcp():
    try:
        import mcp  # noqa: F401
        from mcp.client.stdio import stdio_client  # noqa: F401
    except ImportError:
        raise ValueError("mcp_servers needs the MCP Python SDK: pip install 'lmrl[tools]' (or pip install mcp).") from None


class MCPConnection:
    """A running stdio MCP server and a client session to it."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, timeout_s: float = 30.0):
        _require_mcp()
        if not command:
            raise ValueError("an MCP server command is empty; give e.g. 'python my_server.py'.")
        self.command, self.timeout_s = command, timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="lmrl-mcp")
        self._thread.start()
        self._ready = threading.Event()
        self._closed: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.session: Any = None
        self.tool_list: list[Any] = []
        self._task = asyncio.run_coroutine_threadsafe(self._serve(env), self._loop)
        if not self._ready.wait(timeout_s) or self._error is not None:
            self.close()
            reason = f"{type(self._error).__name__}: {self._error}" if self._error else f"no answer in {timeout_s:g} s"
            raise ValueError(f"MCP server {' '.join(command)!r} did not start ({reason}). Run the command by hand to "
                             "see its error.")
        _OPEN.append(self)

    async def _serve(self, env: dict[str, str] | None) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        self._closed = asyncio.Event()
        try:
            params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=env)
            errlog = sys.stderr if os.environ.get("LMRL_DEBUG") else open(os.devnull, "w")  # servers log a lot
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                self.tool_list = list((await session.list_tools()).tools)
                self.session = session
                self._ready.set()
                await self._closed.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller by __init__
            self._error = exc
            self._ready.set()

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text content of a tool call's result; raises RuntimeError when the server reports an error."""
        if self.session is None:
            raise RuntimeError(f"the MCP server {' '.join(self.command)!r} is closed")
        future = asyncio.run_coroutine_threadsafe(self.session.call_tool(name, arguments), self._loop)
        result = future.result(self.timeout_s)
        text = "\n".join(getattr(c, "text", "") or "" for c in getattr(result, "content", []) or [])
        if getattr(result, "is_error", getattr(result, "isError", False)):
            raise RuntimeError(text or "the MCP tool reported an error")
        return text

    def tools(self) -> list[Tool]:
        """The server's tools as `Tool`s whose function calls the server."""
        out = []
        for t in self.tool_list:
            schema = getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {"type": "object"}
            out.append(Tool(t.name, t.description or "", dict(schema), _caller(self, t.name)))
        return out

    def close(self) -> None:
        if self._closed is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._closed.set)
            try:
                self._task.result(10)
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self.session = None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if self in _OPEN:
            _OPEN.remove(self)


def _caller(conn: MCPConnection, name: str):
    def call(**arguments: Any) -> str:
        return conn.call(name, arguments)

    return call


def mcp_tools(command: list[str], env: dict[str, str] | None = None) -> list[Tool]:
    """Start the MCP server `command` (stdio) and return its tools; it is closed at interpreter exit."""
    return MCPConnection(command, env).tools()


@atexit.register
def _close_all() -> None:
    for conn in list(_OPEN):
        conn.close()
