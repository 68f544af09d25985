"""A test MCP stdio server (PyPI `mcp`) that records what each call was told.

Every call appends one JSON line to the file named by the META_LOG environment variable:
`{"tool": ..., "event": "called" | "started" | "finished" | "cancelled", "meta": {...}}`.

Tools:
- `echo(text)`: returns `text`; records the request's `_meta`.
- `slow(seconds)`: sleeps; records "started", then "finished" or "cancelled" (when the client
  sends `notifications/cancelled`), so a test can see that a cancel reached the server.
"""

import json
import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("meta")
LOG = os.environ.get("META_LOG")


def record(**event) -> None:
    if not LOG:
        return
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(event, sort_keys=True, default=str) + "\n")


def meta_of(ctx: Context) -> dict:
    for get in (lambda: ctx.request_context.meta, lambda: ctx.meta):
        try:
            meta = get()
        except Exception:  # noqa: BLE001 - SDK shape differs across versions
            continue
        if meta is not None:
            return dict(meta)
    return {}


@server.tool()
async def echo(text: str, ctx: Context) -> str:
    """Returns `text`."""
    record(tool="echo", event="called", meta=meta_of(ctx))
    return text


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Sleeps `seconds`, then says done."""
    record(tool="slow", event="started", meta=meta_of(ctx))
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        record(tool="slow", event="cancelled")
        raise
    record(tool="slow", event="finished")
    return "done"


if __name__ == "__main__":
    print("meta_server starting", file=sys.stderr)
    server.run()
