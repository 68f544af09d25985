"""A test MCP server over streamable HTTP (PyPI `mcp`), on a free loopback port.

    python http_server.py PORT_FILE

Binds 127.0.0.1:0, writes the port to PORT_FILE once it listens (tests poll for the file), and
serves MCP at http://127.0.0.1:<port>/mcp.

Tools:
- `headers`: the HTTP request headers of the call as a JSON object (read-only), to prove that
  `headers` from mcp.json (with substituted secrets) reach a url server.
"""

import json
import os
import socket
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("http")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def headers(ctx: Context) -> str:
    """The HTTP headers of this request."""
    return json.dumps({k.lower(): v for k, v in (ctx.headers or {}).items()}, sort_keys=True)


def main() -> None:
    port_file = sys.argv[1]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning")
    tmp = port_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(str(sock.getsockname()[1]))
    os.replace(tmp, port_file)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
