"""MCP servers for the tests, written with the SDK's own server API (``MCPServer``).

Run as ``python -m tests.toolsets.mcp.servers stdio`` or ``... http`` (which prints its port on
the first line of stdout). Tools: ``lookup`` (text), ``slow`` (sleeps), ``fail`` (a tool error),
``picture`` (a small PNG), ``poster`` (a text and a PNG wider than any provider takes),
``grow`` (adds the tool ``extra`` and says its list changed), ``pid``,
``big`` (a long text). With ``MCP_TEST_CALLS`` set, every call appends a line to that file,
so a test can prove a server was, or was not, called.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from tests.fakes.media import png

PICTURE = png(4, 3)
POSTER = png(2400, 60)
"""Wider than either provider's long-edge limit (1568 and 2048 px): fitted before storing."""

server = MCPServer("testsrv")


def _count(name: str) -> None:
    path = os.environ.get("MCP_TEST_CALLS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{name}\n")


@server.tool()
def lookup(key: str) -> str:
    """Look a key up in the test directory."""
    _count("lookup")
    return f"{key} is filed under shelf {sum(map(ord, key)) % 7}"


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep for a while, then answer."""
    _count("slow")
    await asyncio.sleep(seconds)
    return "finally done"


@server.tool()
def fail() -> str:
    """Always fails, with a reason."""
    _count("fail")
    raise ToolError("the ticket system is down")


@server.tool()
def picture() -> Image:
    """A tiny PNG image."""
    _count("picture")
    return Image(data=PICTURE, format="png")


@server.tool()
def poster() -> list[str | Image]:
    """A caption and a large PNG image."""
    _count("poster")
    return ["Here is the poster:", Image(data=POSTER, format="png")]


@server.tool()
def pid() -> int:
    """This server process's id."""
    _count("pid")
    return os.getpid()


@server.tool()
def big(size: int) -> str:
    """A text of ``size`` characters."""
    _count("big")
    return "x" * size


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool ``extra`` and tells the client the tool list changed."""
    _count("grow")

    def extra(word: str) -> str:
        """Added at run time."""
        return word.upper()

    ctx.mcp_server.add_tool(extra, name="extra")
    await ctx.notify_tools_changed()  # 2026 clients: subscriptions/listen
    if ctx.protocol_version is not None and not ctx.protocol_version.startswith("2026"):
        await ctx.session.send_tool_list_changed()  # older clients: the notification
    return "grown"


async def _serve_http() -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # before the port is told: early connections wait in the backlog
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    if sys.argv[1:] == ["http"]:
        asyncio.run(_serve_http())
    else:
        server.run()
