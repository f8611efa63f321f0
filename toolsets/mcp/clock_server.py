"""A tiny MCP server the project ships as an example: the time, over stdio.

Run by the example configuration (``mcp.example.json``) as
``${GATEWAY_PYTHON} -m toolsets.mcp.clock_server``; written with the SDK's own server API
(``MCPServer``), like any third-party server would be. With the offline provider, asking
"what time is it?" makes the agent call its ``now`` tool.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("clock", instructions="Tells the current date and time.")


@server.tool()
def now(timezone: str = "UTC") -> str:
    """The current date and time in an IANA time zone (default UTC), e.g. Europe/Paris."""
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ToolError(f"unknown time zone {timezone!r}") from exc
    moment = datetime.now(UTC).astimezone(zone)
    return moment.strftime(f"%A %Y-%m-%d %H:%M:%S ({timezone})")


if __name__ == "__main__":
    server.run()
