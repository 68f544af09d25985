"""A test MCP stdio server (PyPI `mcp`) that uses too much: memory and processes.

Every call appends one JSON line to the file named by HOG_LOG when it starts, so a test can
count calls across an OOM kill and the resume that follows.

Tools:
- `grow(mb)`: read-only (readOnlyHint, so a resumed run sends it again). The first call (no
  earlier `grow` in the log) allocates `mb` MiB, touching every page, and holds it; later
  calls answer `grew` at once.
- `spawn(n)`: starts up to `n` `sleep 30` processes, one at a time, stopping at the first that
  cannot be started; answers `started K of N` and leaves them running.
"""

import json
import os
import subprocess
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("hog")
LOG = os.environ.get("HOG_LOG")
HELD = []


def calls(tool: str) -> int:
    if not LOG or not os.path.exists(LOG):
        return 0
    with open(LOG, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip() and json.loads(line).get("tool") == tool)


def record(tool: str, **args) -> None:
    if not LOG:
        return
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": tool, "args": args}, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def grow(mb: int) -> str:
    """Allocates `mb` MiB (the first time only)."""
    first = calls("grow") == 0
    record("grow", mb=mb)
    if first:
        for _ in range(mb):
            HELD.append(b"\x01" * (1 << 20))
        time.sleep(30)
    return "grew"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True))
def spawn(n: int) -> str:
    """Starts up to `n` sleeping processes."""
    record("spawn", n=n)
    started = 0
    for _ in range(n):
        try:
            HELD.append(subprocess.Popen(["sleep", "30"]))
            started += 1
        except OSError:
            break
    return f"started {started} of {n}"


if __name__ == "__main__":
    print("hog_server starting", file=sys.stderr)
    server.run()
