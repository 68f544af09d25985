"""A test MCP stdio server (PyPI `mcp`) that reports how it was started.

Tools:
- `environment`: the server's whole environment as a JSON object (read-only).
- `cwd`: the server's working directory (read-only, idempotent).

Used to prove that command servers get a cleared environment (the allowlist, their own `env`
with substituted secrets, PYTHONUTF8, PYTHONIOENCODING, AGEN_BIN) and cwd = the bundle folder.
Logs only to stderr: stdout is the protocol.
"""

import json
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("env")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def environment() -> str:
    """The server process's environment variables as a JSON object."""
    return json.dumps(dict(os.environ), sort_keys=True)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
def cwd() -> str:
    """The server process's working directory."""
    return os.getcwd()


if __name__ == "__main__":
    print("env_server starting", file=sys.stderr)
    server.run()
