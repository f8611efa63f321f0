"""The tool set a call offers, and one round of the model's tool uses run against it.

:class:`ToolRegistry` answers "which tools does a call of this tenant offer" cheaply and with a
stable identity (built-in tools plus the :class:`~gateway.edge.tools.ToolSource` snapshot), so an
unchanged tool set is fingerprinted once (see :mod:`sessions.persist`). :func:`run_tool_uses`
runs one round, each call timed, traced and bounded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.edge.channel import ReplySink
from gateway.edge.errors import ToolError
from gateway.edge.messages import ChannelContext
from gateway.edge.metrics import Metrics
from gateway.edge.observe import ToolInfo, TurnHandle
from gateway.edge.tools import (
    MediaKeeper,
    ReplyTool,
    Tool,
    ToolResult,
    ToolSource,
    schema_of,
    without_media,
)
from sessions.records import MessageDict

log = logging.getLogger(__name__)

_TOOL_SETS_PER_REGISTRY = 1024
"""Tool sets kept per registry (one per tenant, per change of the sources): a bound, not a
tuning knob; a deployment with more tenants just rebuilds some sets."""


class ToolSet:
    """The tools one call offers; :attr:`schemas` is the exact list sent to the provider.
    Files in a result are stored by ``keeper`` (without one they become notes)."""

    def __init__(self, tools: Sequence[Tool], keeper: MediaKeeper | None = None) -> None:
        self.keeper = keeper
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:  # first wins: built-in tools before any source's
                log.warning("tool %s from %s hidden by one of the same name from %s",
                            tool.name, tool.server, self._tools[tool.name].server)
                continue
            self._tools[tool.name] = tool
        self.schemas: tuple[Mapping[str, Any], ...] = tuple(
            schema_of(t) for t in self._tools.values()
        )

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    async def run(self, name: str, args: Mapping[str, Any], context: ChannelContext, *,
                  sink: ReplySink | None = None) -> ToolResult:
        result = await self._run(name, args, context, sink)
        if not result.media:
            return result
        if self.keeper is None:
            return without_media(result)
        return await self.keeper.keep(result, context.tenant)

    async def _run(self, name: str, args: Mapping[str, Any], context: ChannelContext,
                   sink: ReplySink | None) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult(f"unknown tool {name!r}", is_error=True, outcome="unknown")
        try:
            if sink is not None and isinstance(tool, ReplyTool):
                return await tool.run_replying(args, context, sink)
            return await tool.run(args, context)
        except ToolError as exc:
            return ToolResult(str(exc), is_error=True)
        except Exception as exc:  # a bug in the tool must not end the turn; the model is told
            log.exception("tool %s (%s) raised", name, tool.server)
            return ToolResult(f"the tool failed unexpectedly ({type(exc).__name__})",
                              is_error=True, outcome="crash")


class ToolRegistry:
    """Built-in tools plus tool sources; :meth:`for_tenant` is what one call offers.

    :attr:`schemas` and :meth:`run` serve the built-in tools alone (tests, callers without a
    tenant). A tenant's set is cached until a source's generation changes, so an unchanged set
    is the same object call after call (persist fingerprints it once). Every set stores the
    files of results through ``keeper``.
    """

    def __init__(self, tools: Sequence[Tool] = (), sources: Sequence[ToolSource] = (),
                 keeper: MediaKeeper | None = None) -> None:
        self._builtin = tuple(tools)
        self.sources = tuple(sources)
        self.keeper = keeper
        self._static = ToolSet(self._builtin, keeper)
        self.schemas = self._static.schemas
        self._sets: dict[str, tuple[tuple[int, ...], ToolSet]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._static

    async def run(self, name: str, args: Mapping[str, Any], context: ChannelContext, *,
                  sink: ReplySink | None = None) -> ToolResult:
        return await self._static.run(name, args, context, sink=sink)

    def for_tenant(self, tenant: str) -> ToolSet:
        """The tools a call of ``tenant`` offers: built-in first, then each source's."""
        if not self.sources:
            return self._static
        key = tuple([source.generation for source in self.sources])  # a list: no generator
        cached = self._sets.get(tenant)
        if cached is not None and cached[0] == key:
            return cached[1]
        tools = list(self._builtin)
        for source in self.sources:
            tools.extend(source.tools_for(tenant))
        if cached is not None and _same_tools(cached[1], tools):
            chosen = cached[1]  # a change elsewhere: keep this tenant's object (and fingerprint)
        else:
            chosen = ToolSet(tools, self.keeper)
        if len(self._sets) >= _TOOL_SETS_PER_REGISTRY and tenant not in self._sets:
            self._sets.clear()
        self._sets[tenant] = (key, chosen)
        return chosen

    def health(self) -> dict[str, dict[str, Any]]:
        """Every source's parts (MCP servers) by name, as :meth:`ToolSource.health` says."""
        return {name: dict(state) for source in self.sources
                for name, state in source.health().items()}

    async def start(self) -> None:
        for source in self.sources:
            await source.start()

    async def aclose(self) -> None:
        for source in self.sources:
            await source.aclose()

    async def __aenter__(self) -> ToolRegistry:
        """Start the sources (the gateway enters it as a service, after the router)."""
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _same_tools(current: ToolSet, tools: Sequence[Tool]) -> bool:
    return len(current.schemas) == len(tools) and all(
        current.get(t.name) is t for t in tools
    )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """How one tool call went, recorded beside its result (the message entry's ``meta``)."""

    id: str
    tool: str
    server: str
    remote_name: str
    ms: float
    outcome: str

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "server": self.server,
                "name": self.remote_name, "ms": round(self.ms, 3), "outcome": self.outcome}


async def run_tool_uses(tools: ToolSet, uses: Sequence[Mapping[str, Any]],
                        context: ChannelContext, metrics: Metrics,
                        turn: TurnHandle | None = None, sink: ReplySink | None = None,
                        ) -> tuple[MessageDict, dict[str, Any]]:
    """Run the tool calls of one answer, in order: the tool-results message for the model and
    the ``meta`` recorded beside it (server, tool, duration and outcome of each call)."""
    blocks: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for use in uses:
        name = str(use.get("name", ""))
        args = use.get("input") or {}
        tool = tools.get(name)
        observed = turn.tool_started(ToolInfo(name=name, call_id=str(use["id"]),
                                              arguments=args)) if turn is not None else None
        started = time.perf_counter()
        result = await tools.run(name, args, context, sink=sink)
        seconds = time.perf_counter() - started
        if observed is not None:
            observed.finished(result.text, is_error=result.is_error)
        # A name the model made up is recorded, but never becomes a metric label.
        server = tool.server if tool is not None else "-"
        remote = tool.remote_name if tool is not None else "-"
        metrics.tool_calls.labels(server=server, tool=remote, outcome=result.kind).inc()
        metrics.tool_latency.labels(server=server, tool=remote).observe(seconds)
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use["id"],
                                 "content": result.content()}
        if result.is_error:
            block["is_error"] = True
        blocks.append(block)
        calls.append(ToolCall(str(use["id"]), name, server,
                              remote if tool is not None else name, seconds * 1000,
                              result.kind).record())
    return {"role": "user", "content": blocks}, {"toolCalls": calls}
