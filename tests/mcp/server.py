"""An MCP server on the official Python SDK (`mcp`, from PyPI), over stdio, for tests/mcp.rs.

Every call it runs is appended to the file named by MCP_LOG ("<tool> <argument>"), before it
acts, so the test can count what reached the server, and so is each answer to a question it
asks (an elicitation). Some arguments make it exit at once, as a server that crashes mid-call
would.
"""

import os

from pydantic import BaseModel

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("dormant-test-python")
LOG = os.environ["MCP_LOG"]


def log(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as file:
        file.write(line + "\n")
        file.flush()
        os.fsync(file.fileno())


def crash_once(marker: str) -> None:
    """Exits the first time it is called for `marker`."""
    path = LOG + "." + marker
    if not os.path.exists(path):
        open(path, "w").close()
        os._exit(3)


@server.tool(description="Adds two integers.", annotations=ToolAnnotations(readOnlyHint=True))
def add(a: int, b: int) -> int:
    log(f"add {a} {b}")
    return a + b


@server.tool(description="Always fails with the reason given.")
def fail(reason: str) -> str:
    log(f"fail {reason}")
    raise ToolError(reason)


@server.tool(description="Writes a note: not safe to send twice.")
def write_note(note: str) -> str:
    log(f"write_note {note}")
    if note == "crash":
        os._exit(3)
    return f"wrote {note}"


@server.tool(
    description="Looks a key up: safe to send twice.",
    annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True),
)
def lookup(key: str) -> str:
    log(f"lookup {key}")
    if key == "crash-once":
        crash_once(key)
    return f"value of {key}"


class Seat(BaseModel):
    seat: str


@server.tool(description="Books a seat, asking which one: not safe to send twice.")
async def book(flight: str, ctx: Context) -> str:
    log(f"book {flight}")
    answer = await ctx.elicit(message=f"Which seat on {flight}?", schema=Seat)
    if answer.action == "accept":
        log(f"answer accept {answer.data.seat}")
        return f"booked {answer.data.seat} on {flight}"
    log(f"answer {answer.action}")
    return f"not booked: {answer.action}"


if __name__ == "__main__":
    server.run("stdio")
