"""Tools from an MCP server over stdio, through the official `mcp` Python SDK (extra: `pip install 'lmrl[tools]'`).

    tools = mcp_tools(["python", "my_server.py"])     # starts the server, lists its tools
    ToolBox(tools).execute(ToolCall("add", {"a": 2, "b": 3}))        # ToolResult("5")

The SDK is async; the rollout loop is not. One `MCPConnection` runs the client session in a private event loop
on a daemon thread: a single task opens the stdio transport and the session, serves until `close()`, then
closes them (the SDK's transports must be entered and left by the same task). Calls from the loop block on
that thread with a timeout. A tool error reported by the server (`isError`) raises, so `ToolBox` turns it
into an error observation like any other failing tool. Servers are closed at exit.

A command whose program is `python` or `python3` runs with the interpreter that runs lmrl (`sys.executable`), so
`mcp_servers='["python my_server.py"]'` works without an activated venv. `server_command` checks a command line
(quotes, the program, a `python X.py` script) at start-up; a server that starts and dies is reported with the
tail of what it printed to stderr. `mcp_tools` keeps one connection per command, so a server started before the
model loads (`lmrl.rollout.tools.section.start_servers`) is the one the run uses.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import os
import shlex
import shutil
import sys
import tempfile
import threading
from typing import Any

from lmrl.rollout.tools.toolbox import Tool

_OPEN: list[MCPConnection] = []


PYTHON_NAMES = ("python", "python3")
"""Programs that mean "the Python running lmrl" in a server command."""


def server_command(line: str) -> list[str]:
    """The argv of an `mcp_servers` entry, its program resolved (`python` -> `sys.executable`); a ValueError naming
    the entry when it does not parse, is empty, names no program on PATH or a `python` script that does not exist."""
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise ValueError(
            f"mcp_servers entry {line!r} is not a command line ({exc}); give e.g. 'python my_server.py'."
        ) from None
    if not argv:
        raise ValueError("an mcp_servers entry is empty; give a command line, e.g. 'python my_server.py'.")
    if argv[0] in PYTHON_NAMES:
        argv[0] = sys.executable
    program = argv[0]
    if not (shutil.which(program) or (os.sep in program and os.access(program, os.X_OK))):
        raise ValueError(
            f"MCP server {line!r}: {program!r} is not a program on PATH (nor an executable file). Give "
            "the full path of the program, or start the server with 'python ...' (lmrl's Python)."
        )
    if program == sys.executable and len(argv) > 1 and argv[1].endswith(".py") and not os.path.isfile(argv[1]):
        raise ValueError(f"MCP server {line!r}: the script {argv[1]!r} does not exist (relative to {os.getcwd()}).")
    return argv


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups: what the SDK's task groups wrap."""
    inner = getattr(exc, "exceptions", None)
    return [leaf for e in inner for leaf in _leaves(e)] if inner else [exc]


NO_SDK = "mcp_servers needs the MCP Python SDK: pip install 'lmrl[tools]' (or pip install mcp)."


def sdk_installed() -> bool:
    """Whether the MCP SDK can be imported (found without importing it: a start-up check that costs nothing)."""
    return importlib.util.find_spec("mcp") is not None


def require_mcp():
    try:
        import mcp  # noqa: F401
        from mcp.client.stdio import stdio_client  # noqa: F401
    except ImportError:
        raise ValueError(NO_SDK) from None


class MCPConnection:
    """A running stdio MCP server and a client session to it."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, timeout_s: float = 30.0):
        require_mcp()
        if not command:
            raise ValueError("an MCP server command is empty; give e.g. 'python my_server.py'.")
        self.command, self.env, self.timeout_s = command, env, timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="lmrl-mcp")
        self._thread.start()
        self._ready = threading.Event()
        self._closed: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.session: Any = None
        self.tool_list: list[Any] = []
        self._stderr = tempfile.TemporaryFile("w+", errors="replace")  # its tail explains a server that dies
        self._task = asyncio.run_coroutine_threadsafe(self._serve(env), self._loop)
        if not self._ready.wait(timeout_s) or self._error is not None:
            message = self._start_error(timeout_s)
            self.close()
            raise ValueError(message)
        _OPEN.append(self)

    def _start_error(self, timeout_s: float) -> str:
        if self._error is None:
            reason = f"no answer in {timeout_s:g} s"
        else:
            reason = "; ".join(dict.fromkeys(f"{type(e).__name__}: {e}" for e in _leaves(self._error)))
        self._stderr.seek(0)
        tail = self._stderr.read()[-1500:].strip()
        said = f"\nIts stderr ends with:\n{tail}" if tail else ""
        return (
            f"MCP server {shlex.join(self.command)!r} did not start ({reason}). Run the command by hand to see "
            f"its error; set LMRL_DEBUG=1 to see what it prints.{said}"
        )

    async def _serve(self, env: dict[str, str] | None) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        self._closed = asyncio.Event()
        try:
            params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=env)
            errlog = sys.stderr if os.environ.get("LMRL_DEBUG") else self._stderr  # servers log a lot
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
        self._stderr.close()


def _caller(conn: MCPConnection, name: str):
    def call(**arguments: Any) -> str:
        return conn.call(name, arguments)

    return call


def mcp_tools(command: list[str], env: dict[str, str] | None = None) -> list[Tool]:
    """The tools of the MCP server `command` (stdio), started unless a connection to it is open; it is closed at
    interpreter exit. `python`/`python3` as the program is lmrl's interpreter."""
    command = [sys.executable if i == 0 and a in PYTHON_NAMES else a for i, a in enumerate(command)]
    for conn in _OPEN:
        if conn.command == command and conn.env == env and conn.session is not None:
            return conn.tools()
    return MCPConnection(command, env).tools()


@atexit.register
def _close_all() -> None:
    for conn in list(_OPEN):
        conn.close()
