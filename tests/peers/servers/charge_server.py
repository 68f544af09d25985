"""A test MCP stdio server (PyPI `mcp`) that counts real executions of a side effect.

`charge(amount, seconds=0)` is side-effecting (no readOnlyHint, no idempotentHint). Every
execution appends one fsynced JSON line to the file named by CHARGE_LOG before it sleeps
`seconds`: `{"task": <agen/taskId>, "run": <agen/runId>, "key": <agen/idempotencyKey>,
"amount": amount}`, so a fault test counts how often each task's charge really ran, across
kills of the Hub, Nests and instances.

    python charge_server.py              # stdio
    python charge_server.py --http PORT_FILE

With `--http` it serves streamable HTTP on a free loopback port instead (MCP at
http://127.0.0.1:<port>/mcp) and writes the port to PORT_FILE once it listens, so a test can
cut a `url` server's connection mid-call by killing it.
"""

import json
import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("charge")
LOG = os.environ.get("CHARGE_LOG")


def meta_of(ctx: Context) -> dict:
    for get in (lambda: ctx.request_context.meta, lambda: ctx.meta):
        try:
            meta = get()
        except Exception:  # noqa: BLE001 - SDK shape differs across versions
            continue
        if meta is not None:
            return dict(meta)
    return {}


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False))
async def charge(amount: int, ctx: Context, seconds: float = 0) -> str:
    """Charges `amount` to the customer's card (a side effect)."""
    meta = meta_of(ctx)
    line = {
        "task": meta.get("agen/taskId", ""),
        "run": meta.get("agen/runId", ""),
        "key": meta.get("agen/idempotencyKey", ""),
        "amount": amount,
    }
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
    await anyio.sleep(seconds)
    return f"charged {amount}"


def serve_http(port_file: str) -> None:
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    app = server.streamable_http_app(host="127.0.0.1")
    tmp = port_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(str(sock.getsockname()[1]))
    os.replace(tmp, port_file)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    print("charge_server starting", file=sys.stderr)
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        serve_http(sys.argv[2])
    else:
        server.run()
