"""Every configured MCP server as one :class:`gateway.edge.tools.ToolSource`.

The toolbox starts one :class:`~toolsets.mcp.connection.ServerConnection` per server and
answers "which MCP tools does tenant T see" from their current tool lists: servers in the
file's order, each server's tools in the order it lists them, only servers granted to the
tenant. The answer is cached per tenant and dropped whenever a server changes (its
:attr:`generation` moves), so the per-call cost is a dictionary lookup.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolsets.mcp.config import McpConfig
from toolsets.mcp.connection import ConnectionSettings, McpTool, ServerConnection
from toolsets.mcp.names import tool_name

log = logging.getLogger(__name__)

_HEALTH = {"connected": "up"}
"""A connection's status as ``/healthz`` words it (the others read the same)."""


@dataclass(frozen=True, slots=True)
class ToolboxSettings:
    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    start_timeout: float = 20.0
    """How long :meth:`McpToolbox.start` waits for the first attempt of every server."""


class McpToolbox:
    """The MCP servers of one :class:`McpConfig`. An async context manager."""

    def __init__(self, config: McpConfig, settings: ToolboxSettings | None = None) -> None:
        self.config = config
        self.settings = settings or ToolboxSettings()
        self.servers = tuple(ServerConnection(server, self.settings.connection, self._changed)
                             for server in config.servers)
        self._generation = 0
        self._cache: dict[str, tuple[McpTool, ...]] = {}
        self._started = False
        for key in config.ignored:
            log.info("MCP config: %s is not used by this gateway (ignored)", key)

    @property
    def generation(self) -> int:
        return self._generation

    def _changed(self) -> None:
        self._generation += 1
        self._cache.clear()

    def server(self, name: str) -> ServerConnection | None:
        return next((s for s in self.servers if s.config.name == name), None)

    def tools_for(self, tenant: str) -> Sequence[McpTool]:
        cached = self._cache.get(tenant)
        if cached is None:
            cached = tuple(tool for server in self.servers if server.config.visible_to(tenant)
                           for tool in server.tools)
            self._cache[tenant] = cached
        return cached

    def health(self) -> dict[str, dict[str, Any]]:
        """Each server for the full ``/healthz``: ``status`` (``up``, ``starting``,
        ``restarting``, ``failed`` or ``stopped``), ``tools`` (how many it offers now) and
        ``restarts`` (times it came back after being up). No reasons: they can name URLs."""
        return {server.config.name: {
            "status": _HEALTH.get(server.status, server.status),
            "tools": len(server.tools),
            "restarts": max(0, server.connects - 1),
        } for server in self.servers}

    def report(self) -> list[dict[str, Any]]:
        """Each server's state, for operators (``gateway tools list``): JSON-ready, in the
        file's order; tools by their names at the server, with the name the model sees."""
        servers = []
        for server in self.servers:
            config = server.config
            servers.append({
                "name": config.name,
                "transport": config.transport,
                "where": config.where(),
                "status": server.status,
                "error": server.error,
                "protocol": server.protocol,
                "tenants": sorted(config.tenants) if config.tenants is not None else None,
                "tools": [{"name": tool.name, "as": tool_name(config.name, tool.name),
                           "offered": config.allows(tool.name)} for tool in server.listed],
            })
        return servers

    async def start(self) -> None:
        """Start every server; return once each has connected or failed once (bounded)."""
        if self._started:
            return
        self._started = True
        for server in self.servers:
            server.start()
        if not self.servers:
            return
        waits = asyncio.gather(*(s.ready() for s in self.servers))
        try:
            async with asyncio.timeout(self.settings.start_timeout):
                await waits
        except TimeoutError:
            for server in self.servers:
                if server.status == "starting":
                    log.warning("MCP server %s is still starting after %g s; its tools join "
                                "when it is up", server.config.name, self.settings.start_timeout)

    async def aclose(self) -> None:
        """Stop every server (idempotent)."""
        await asyncio.gather(*(server.aclose() for server in self.servers))

    async def __aenter__(self) -> McpToolbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
