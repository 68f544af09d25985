"""A small, generic MCP stdio client driver built on the official Python MCP SDK (PyPI `mcp`).

End-to-end tests use it as a real third-party peer for any stdio MCP server (ours or not):

    target/peers/venv/bin/python tests/peers/mcp_client.py [options] -- <server command> [args...]

It starts the server, runs `initialize`, lists the tools, then makes the calls read from stdin
and prints ONE JSON object on stdout. stdin holds either a JSON list of calls or an object
`{"calls": [...]}`; each call is

    {"name": "read", "arguments": {"path": "a.txt"}, "meta": {...}?, "timeout": 30?}

(`timeout` is the client-side read timeout in seconds for that call; `meta` becomes the
request's `_meta`). Empty stdin means no calls (initialize + tools/list only).

Output (keys are snake_case at the top level; MCP objects keep their wire names):

    {
      "server_info": {"name": ..., "version": ...},
      "protocol_version": "...",
      "capabilities": {...},
      "instructions": "..." | null,
      "tools": [ {"name", "description", "inputSchema", "annotations", ...}, ... ],
      "results": [
        {"name": "read", "is_error": false, "text": "<all text blocks joined by newlines>",
         "content": [ {"type": "text", "text": ...}, ... ], "structured_content": ... | null,
         "elapsed_ms": 12, "error": null},
        ...
      ]
    }

A call that fails at the protocol level (JSON-RPC error, client timeout) has `"error": "<message>"`,
`"is_error": true` and no content; the driver carries on with the next call. The exit code is 0
when the session could be set up (even if calls failed) and 1 otherwise, with the reason on stderr.

Options:
    --env KEY=VALUE   extra environment variable for the server (repeatable)
    --cwd DIR         working directory of the server
    --no-list         skip tools/list ("tools" is then null)
    --timeout SECS    default per-call read timeout (default 300)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any

import anyio

from mcp import ClientSession, StdioServerParameters, stdio_client


def _dump(model: Any) -> Any:
    """Serialises an SDK (pydantic) object the way it travels on the wire."""
    if model is None:
        return None
    if hasattr(model, "model_dump"):
        return model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return model


def _parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        sys.exit("usage: mcp_client.py [--env K=V]... [--cwd DIR] [--no-list] [--timeout S] -- <server command> [args...]")
    split = argv.index("--")
    own, server = argv[:split], argv[split + 1 :]
    if not server:
        sys.exit("mcp_client.py: no server command after `--`")
    parser = argparse.ArgumentParser(prog="mcp_client.py")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--cwd", default=None)
    parser.add_argument("--no-list", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    return parser.parse_args(own), server


def _read_calls() -> list[dict[str, Any]]:
    raw = sys.stdin.read().strip()
    if not raw:
        return []
    doc = json.loads(raw)
    if isinstance(doc, dict):
        doc = doc.get("calls", [])
    if not isinstance(doc, list):
        raise ValueError("stdin must be a JSON list of calls or an object with a `calls` list")
    return doc


async def _run(opts: argparse.Namespace, server: list[str], calls: list[dict[str, Any]]) -> dict[str, Any]:
    env: dict[str, str] = {}
    for item in opts.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--env expects KEY=VALUE, got {item!r}")
        env[key] = value
    params = StdioServerParameters(command=server[0], args=server[1:], env=env or None, cwd=opts.cwd)
    out: dict[str, Any] = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out["server_info"] = _dump(init.server_info)
            out["protocol_version"] = init.protocol_version
            out["capabilities"] = _dump(init.capabilities)
            out["instructions"] = init.instructions
            if opts.no_list:
                out["tools"] = None
            else:
                listed = await session.list_tools()
                out["tools"] = [_dump(tool) for tool in listed.tools]
            results = []
            for call in calls:
                name = call["name"]
                started = time.monotonic()
                entry: dict[str, Any] = {"name": name}
                try:
                    result = await session.call_tool(
                        name,
                        call.get("arguments") or {},
                        read_timeout_seconds=float(call.get("timeout", opts.timeout)),
                        meta=call.get("meta"),
                    )
                    content = [_dump(block) for block in result.content]
                    entry.update(
                        is_error=bool(result.is_error),
                        text="\n".join(b.get("text", "") for b in content if b.get("type") == "text"),
                        content=content,
                        structured_content=result.structured_content,
                        error=None,
                    )
                except Exception as exc:  # a protocol-level failure of this one call
                    entry.update(is_error=True, text="", content=[], structured_content=None, error=f"{type(exc).__name__}: {exc}")
                entry["elapsed_ms"] = int((time.monotonic() - started) * 1000)
                results.append(entry)
            out["results"] = results
    return out


def main() -> int:
    opts, server = _parse_args(sys.argv[1:])
    try:
        calls = _read_calls()
        out = anyio.run(_run, opts, server, calls)
    except BaseException as exc:  # report why the session could not be set up
        if isinstance(exc, KeyboardInterrupt):
            raise
        print(f"mcp_client.py: session failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        return 1
    json.dump(out, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
