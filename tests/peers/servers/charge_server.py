"""A test MCP stdio server (PyPI `mcp`) that counts real executions of a side effect.

`charge(amount, seconds=0)` is side-effecting (no readOnlyHint, no idempotentHint). Every
execution appends one fsynced JSON line to the file named by CHARGE_LOG before it sleeps
`seconds`: `{"task": <agen/taskId>, "run": <agen/runId>, "key": <agen/idempotencyKey>,
"amount": amount}`, so a fault test counts how often each task's charge really ran, across
kills of the Hub, Nests and instances.
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


if __name__ == "__main__":
    print("charge_server starting", file=sys.stderr)
    server.run()
