"""An MCP server for the confinement tests (``python -m tests.toolsets.mcp.confined_server``).

Tools: ``where`` (its working directory, ``HOME`` and environment variable names),
``read_file`` (a file's text, relative to its working directory), ``noise`` (writes to
stderr), ``big`` (a long text), ``lookup`` (a short one).
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("confined")


@server.tool()
def where() -> str:
    """``cwd``, ``HOME`` and the sorted environment variable names, one per line."""
    return "\n".join([os.getcwd(), os.environ.get("HOME", ""), " ".join(sorted(os.environ))])


@server.tool()
def read_file(path: str) -> str:
    """The text of ``path``."""
    with open(path, encoding="utf-8") as source:
        return source.read()


@server.tool()
def noise(size: int, marker: str) -> str:
    """Writes about ``size`` bytes to stderr, then a line with ``marker``."""
    line = "n" * 1023 + "\n"
    for _ in range(size // 1024):
        sys.stderr.write(line)
    sys.stderr.write(f"{marker}\n")
    sys.stderr.flush()
    return "written"


@server.tool()
def big(size: int) -> str:
    """A text of ``size`` characters."""
    return "x" * size


@server.tool()
def lookup(key: str) -> str:
    """A short answer."""
    return f"{key} is here"


if __name__ == "__main__":
    server.run()
