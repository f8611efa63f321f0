"""The composition root, tool half: the MCP servers of ``GATEWAY_MCP_CONFIG``.

The toolbox a gateway runs, the secrets its config holds (for log redaction), the report of
``gateway tools list`` and the live tool set of ``gateway replay --rerun --live-tools``. Kept
apart from :mod:`app.compose` because those commands start the servers without a gateway,
and because the MCP logs' folder is also what an erasure clears (:mod:`app.compose_erasure`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from app.compose_media import build_keeper
from app.config import Settings
from gateway.agent.tools import ToolSet
from gateway.edge.errors import ConfigError
from gateway.edge.provider import Provider
from gateway.edge.tools import ToolSource
from sessions.blobs import BlobStore


def build_toolbox(settings: Settings) -> ToolSource | None:
    """The MCP servers of ``GATEWAY_MCP_CONFIG`` (not started), or None when it is unset.

    Raises :class:`ConfigError` for an unreadable or invalid file, naming the server and key."""
    if settings.mcp_config is None:
        return None
    from toolsets.mcp import McpToolbox, ToolboxSettings, load_config
    from toolsets.mcp.connection import ConnectionSettings

    return McpToolbox(load_config(settings.mcp_config), ToolboxSettings(
        connection=ConnectionSettings(
            call_timeout=settings.mcp_tool_timeout,
            max_result_chars=settings.mcp_max_result_chars,
            connect_timeout=settings.mcp_start_timeout,
            log_dir=settings.data_dir / MCP_LOGS_DIR,
            # The result's text JSON-escaped at worst, and one attachment's worth of files.
            max_message_bytes=(6 * settings.mcp_max_result_chars
                               + settings.max_attachment_bytes * 4 // 3 + 64 * 1024),
        ),
        start_timeout=settings.mcp_start_timeout,
    ))


def tool_secrets(settings: Settings) -> list[str]:
    """Values of the MCP servers' headers and env (tokens, as a rule), for log redaction.
    An invalid file gives none here: building the gateway reports it."""
    if settings.mcp_config is None:
        return []
    from toolsets.mcp import load_config

    try:
        return load_config(settings.mcp_config).secrets()
    except ConfigError:
        return []


async def tool_servers_report(settings: Settings) -> list[dict[str, Any]] | None:
    """Start every configured MCP server once, report its state and tools, stop them all
    (``gateway tools list``). None when ``GATEWAY_MCP_CONFIG`` is unset."""
    if settings.mcp_config is None:
        return None
    from toolsets.mcp import McpToolbox

    toolbox = build_toolbox(settings)
    assert isinstance(toolbox, McpToolbox)
    async with toolbox:
        return toolbox.report()


@asynccontextmanager
async def live_tool_set(settings: Settings, tenant: str, *, enabled: bool = True,
                        provider: Provider | None = None, blobs: BlobStore | None = None,
                        ) -> AsyncIterator[ToolSet | None]:
    """The MCP tools ``tenant`` sees, with their servers running (``gateway replay --rerun
    --live-tools``); None when not enabled. Persona tools are never part of it. Files the
    tools return go to ``blobs`` (fitted for ``provider``), as in a live turn: the same
    image is the same reference, so a live result compares equal to the recorded one."""
    toolbox = build_toolbox(settings) if enabled else None
    if not enabled:
        yield None
        return
    keeper = (build_keeper(settings, provider, blobs)
              if provider is not None and blobs is not None else None)
    if toolbox is None:
        yield ToolSet([], keeper)
        return
    try:
        await toolbox.start()
        yield ToolSet(toolbox.tools_for(tenant), keeper)
    finally:
        await toolbox.aclose()


MCP_LOGS_DIR = "mcp-logs"
"""Where stdio MCP servers' stderr goes: ``<data>/mcp-logs/<server>.log``."""
