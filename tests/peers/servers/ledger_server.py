"""A test MCP stdio server (PyPI `mcp`) for the effect ledger: one tool of each retry class.

Every call appends one JSON line to the file named by the LEDGER_LOG environment variable
when it starts (`{"tool": ..., "args": {...}}`), so a test can count how often each tool was
really called across crashes and resumes. `seconds` is slept only by the first call of a tool
(the log has no earlier call of it), so a retried call after a resume answers at once.

Tools:
- `charge(amount, seconds=0, kill_instance=False)`: side-effecting (no readOnlyHint, no
  idempotentHint); sleeps `seconds` (first call only), then says `charged <amount>`. With
  `kill_instance` it also SIGKILLs its parent (the agent instance) 0, 1, 3 or 8 ms after it
  answers (by the number of earlier charges): the crash window between a side effect's result
  and its "completed" being durable.
- `put(key, value, seconds=0)`: idempotent (idempotentHint, not read-only); sleeps, says
  `stored <key>`.
- `lookup(key, seconds=0)`: read-only (readOnlyHint); sleeps, says `value of <key>`.
"""

import json
import os
import signal
import sys
import threading
import time

import anyio
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("ledger")
LOG = os.environ.get("LEDGER_LOG")


def first_call(tool: str) -> bool:
    if not LOG or not os.path.exists(LOG):
        return True
    with open(LOG, encoding="utf-8") as f:
        return not any(json.loads(line).get("tool") == tool for line in f if line.strip())


async def record_and_wait(tool: str, seconds: float, **args) -> None:
    first = first_call(tool)
    record(tool, seconds=seconds, **args)
    if first:
        await anyio.sleep(seconds)


def record(tool: str, **args) -> None:
    if not LOG:
        return
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": tool, "args": args}, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False))
async def charge(amount: int, seconds: float = 0, kill_instance: bool = False) -> str:
    """Charges `amount` to the customer's card (a side effect)."""
    earlier = count("charge")
    await record_and_wait("charge", seconds, amount=amount)
    if kill_instance:
        kill_parent_after([0, 1, 3, 8][earlier % 4] / 1000)
    return f"charged {amount}"


def count(tool: str) -> int:
    if not LOG or not os.path.exists(LOG):
        return 0
    with open(LOG, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip() and json.loads(line).get("tool") == tool)


def kill_parent_after(seconds: float) -> None:
    parent = os.getppid()

    def kill() -> None:
        time.sleep(seconds)
        os.kill(parent, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()


@server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True))
async def put(key: str, value: str, seconds: float = 0) -> str:
    """Stores `value` under `key` (idempotent)."""
    await record_and_wait("put", seconds, key=key, value=value)
    return f"stored {key}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def lookup(key: str, seconds: float = 0) -> str:
    """Reads the value of `key` (read-only)."""
    await record_and_wait("lookup", seconds, key=key)
    return f"value of {key}"


if __name__ == "__main__":
    print("ledger_server starting", file=sys.stderr)
    server.run()
