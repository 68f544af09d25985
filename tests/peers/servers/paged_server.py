"""A test MCP stdio server (PyPI `mcp`, low-level API) that lists its tools in pages.

`tools/list` returns 3 tools per page with a `nextCursor`, 8 tools in all (`t0` … `t6` and
`mixed`), so a client sees every tool only if it follows the cursor. Each `t<i>` answers with its
own name and its arguments; `t0` is read-only, `t1` idempotent. `mixed` answers with no text:
a 4-byte PNG image and structured content `{"n": 1}`.
"""

import base64
import json

import anyio
import mcp.server.stdio
from mcp import types
from mcp.server.lowlevel import Server

PAGE = 3
TOOLS = [
    types.Tool(
        name=f"t{i}",
        description=f"tool number {i}",
        input_schema={"type": "object", "properties": {"x": {"type": "integer"}}},
        annotations=types.ToolAnnotations(read_only_hint=(i == 0), idempotent_hint=(i == 1)),
    )
    for i in range(7)
] + [types.Tool(name="mixed", description="image and structured content", input_schema={"type": "object"})]


async def list_tools(ctx, params):
    start = int(params.cursor) if params is not None and params.cursor else 0
    page = TOOLS[start : start + PAGE]
    nxt = str(start + PAGE) if start + PAGE < len(TOOLS) else None
    return types.ListToolsResult(tools=page, next_cursor=nxt)


async def call_tool(ctx, params):
    if params.name == "mixed":
        image = types.ImageContent(type="image", data=base64.b64encode(b"\x89PNG").decode(), mime_type="image/png")
        return types.CallToolResult(content=[image], structured_content={"n": 1})
    text = json.dumps({"tool": params.name, "arguments": params.arguments or {}}, sort_keys=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("paged", on_list_tools=list_tools, on_call_tool=call_tool)


async def main():
    async with mcp.server.stdio.stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
