"""A test MCP stdio server (PyPI `mcp`) with resources and prompts, and one tool.

Resources:
- `library://style` (text/markdown): the house style guide.
- `library://secret` (text/plain): a secret a test's permissions keep from the model.
Prompts:
- `house_style`: one user message, the house style.
Tools:
- `echo(text)`: returns `text`.

Every resource read appends `{"read": uri}` to the file named by LIBRARY_LOG, if set, so a
test sees which reads reached the server.
"""

import json
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("library")
LOG = os.environ.get("LIBRARY_LOG")
STYLE = "House style: answer in haiku, never more than three lines."


def record(uri: str) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps({"read": uri}) + "\n")


@server.resource("library://style", name="style", description="the house style guide", mime_type="text/markdown")
def style() -> str:
    record("library://style")
    return "# Style\n" + STYLE


@server.resource("library://secret", name="secret", mime_type="text/plain")
def secret() -> str:
    record("library://secret")
    return "the vault code is 4711"


@server.prompt()
def house_style() -> str:
    """The house style as a system prompt."""
    return STYLE


@server.tool()
def echo(text: str) -> str:
    """Returns `text`."""
    return text


if __name__ == "__main__":
    print("library_server starting", file=sys.stderr)
    server.run()
