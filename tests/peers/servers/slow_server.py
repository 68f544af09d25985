"""A test MCP stdio server (PyPI `mcp`) with one slow tool, for parallel-call and timeout tests.

Tools:
- `sleep(seconds, label)`: sleeps `seconds`, then returns `<label> slept <seconds>s`, so a test can
  tell the results of two calls apart and check the order they come back in.
Logs only to stderr: stdout is the protocol.
"""

import sys

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("slow")


@server.tool()
async def sleep(seconds: float, label: str) -> str:
    """Sleeps `seconds`, then says who slept."""
    await anyio.sleep(seconds)
    return f"{label} slept {seconds}s"


if __name__ == "__main__":
    print("slow_server starting", file=sys.stderr)
    server.run()
