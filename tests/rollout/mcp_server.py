"""A tiny MCP server over stdio for tests: `add` and `fail` tools (official SDK, v2 MCPServer or v1 FastMCP)."""

try:
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:  # mcp < 2
    from mcp.server.fastmcp import FastMCP as Server

app = Server("lmrl-test")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def fail(reason: str) -> str:
    """Always raises."""
    raise RuntimeError(reason)


if __name__ == "__main__":
    app.run()
