"""A test MCP stdio server (PyPI `mcp`, low-level API) with one read-only tool, `big`, that
answers with `bytes` characters: `0123456789` repeated, then `END` as the last three.
"""

import anyio
import mcp.server.stdio
from mcp import types
from mcp.server.lowlevel import Server

TOOLS = [
    types.Tool(
        name="big",
        description="a long text of the given length",
        input_schema={"type": "object", "properties": {"bytes": {"type": "integer"}}},
        annotations=types.ToolAnnotations(read_only_hint=True),
    )
]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params):
    n = int((params.arguments or {}).get("bytes", 10))
    body = ("0123456789" * (n // 10 + 1))[: max(n - 3, 0)] + "END"
    return types.CallToolResult(content=[types.TextContent(type="text", text=body)])


server = Server("big", on_list_tools=list_tools, on_call_tool=call_tool)


async def main():
    async with mcp.server.stdio.stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
