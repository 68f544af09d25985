"""A test MCP stdio server (PyPI `mcp`) that dies on request.

Tools:
- `crash(code)`: writes `crash-marker: exiting with <code>` to stderr and exits the process at
  once with that code (no reply is sent).
- `ping`: returns "pong".
"""

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("crash")


@server.tool()
def crash(code: int = 3) -> str:
    """Exits the server process immediately."""
    print(f"crash-marker: exiting with {code}", file=sys.stderr, flush=True)
    os._exit(code)


@server.tool()
def ping() -> str:
    """Answers pong."""
    return "pong"


if __name__ == "__main__":
    server.run()
