"""The tool seam: tools the model can call, where they come from, and the registry the loop uses.

A tool is a name, a JSON schema and an async function from the model's input to a result. Its
schema goes to the provider verbatim (and into the log as a ``tools`` entry). A tool that
delivers something to the person (``send_file``) is a :class:`ReplyTool`: it also gets the
turn's reply sink. A tool may also answer with files the model should see (an MCP server's
screenshot): they come back as :class:`ToolMedia` and the registry's :class:`MediaKeeper` stores
them before the result is recorded, so the log holds references, never bytes. Built-in tools
(the persona's) are fixed; a :class:`ToolSource` (the MCP servers of ``toolsets/``) adds tools
that may come and go while the gateway runs and that some tenants may not see. The registry
answers "which tools does a call of this tenant offer" cheaply and with a stable identity, so
an unchanged tool set is fingerprinted once (see :mod:`sessions.persist`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gateway.channel import ReplySink
from gateway.errors import ToolError
from gateway.messages import ChannelContext
from gateway.metrics import Metrics
from gateway.observe import ToolInfo, TurnHandle
from sessions.records import MessageDict

log = logging.getLogger("gateway.tools")

OUTCOMES = ("ok", "error", "timeout", "oversize", "unavailable", "unknown", "crash")
"""How a tool call ended, as recorded and counted: the tool answered (``ok``), said it failed
(``error``), took too long, answered more than the size cap, its server is down, the model
named a tool the call did not offer, or the tool raised something it should not have."""

_TOOL_SETS_PER_REGISTRY = 1024
"""Tool sets kept per registry (one per tenant, per change of the sources): a bound, not a
tuning knob; a deployment with more tenants just rebuilds some sets."""


@dataclass(frozen=True, slots=True)
class ToolMedia:
    """A file a tool returned for the model to see (an image, a PDF), not stored yet.

    ``media_type`` is what the tool claimed (the keeper sniffs the bytes and trusts only
    them); ``name`` labels it for people and the model (``picture-1``), and the tool's text
    should say where it was (``[image: picture-1]``)."""

    data: bytes
    media_type: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool answered: the text given to the model, and how the call ended.
    ``attachments`` are content blocks recorded with the text in the tool result (references
    to files the tool stored, e.g. one it sent). ``media`` are files not stored yet; the
    registry's :class:`MediaKeeper` turns them into ``attachments`` (or notes) before the
    result leaves :meth:`ToolSet.run`."""

    text: str
    is_error: bool = False
    attachments: tuple[Mapping[str, Any], ...] = ()
    outcome: str = ""
    """One of :data:`OUTCOMES`; empty means ``error`` when ``is_error``, else ``ok``."""
    media: tuple[ToolMedia, ...] = ()

    @property
    def kind(self) -> str:
        return self.outcome or ("error" if self.is_error else "ok")

    def content(self) -> str | list[dict[str, Any]]:
        """The ``tool_result`` content: the text, or the text and the attachment blocks (an
        empty text is left out there: providers refuse empty text blocks)."""
        if not self.attachments:
            return self.text
        text = [{"type": "text", "text": self.text}] if self.text else []
        return [*text, *(dict(a) for a in self.attachments)]


class Tool(Protocol):
    """A callable tool. Contract: :meth:`run` raises :class:`ToolError` for a bad request and
    returns an error :class:`ToolResult` for a failure it understands (a timeout, a server that
    is down); any other exception is a bug, reported to the model as an error result and
    logged. ``server`` names where it comes from (``persona``, an MCP server's name) and
    ``remote_name`` its name there; both are recorded with each call, never sent."""

    name: str
    description: str
    input_schema: Mapping[str, Any]

    @property
    def server(self) -> str: ...

    @property
    def remote_name(self) -> str: ...

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult: ...


@runtime_checkable
class ReplyTool(Protocol):
    """A tool that delivers to the person through the turn's reply sink (send_file). Its
    :meth:`run_replying` is called instead of ``run`` when there is a sink."""

    async def run_replying(self, args: Mapping[str, Any], context: ChannelContext,
                           sink: ReplySink) -> ToolResult: ...


class MediaKeeper(Protocol):
    """Stores the files of tool results (:attr:`ToolResult.media`).

    Contract: :meth:`keep` returns ``result`` with ``media`` empty: each file checked (type
    sniffed from its bytes, images fitted to the provider's limits), stored in ``tenant``'s
    blob store and referenced from ``attachments`` in order, or, when it cannot be used
    (unknown type, too large, a store fault), named in a note appended to the text. It never
    raises for bad input or a storage fault."""

    async def keep(self, result: ToolResult, tenant: str) -> ToolResult: ...


def without_media(result: ToolResult) -> ToolResult:
    """``result`` with its media left out, each named in a note (no keeper to store them)."""
    notes = [f"[{m.name} was not passed on: files from tools are not kept here]"
             for m in result.media]
    text = "\n".join([result.text, *notes] if result.text else notes)
    return dataclasses.replace(result, text=text, media=())


class ToolSource(Protocol):
    """Tools from outside the core that change while the gateway runs (MCP servers).

    Contract: :attr:`generation` changes whenever :meth:`tools_for` may answer differently (a
    server connected, died for good, or changed its tool list); :meth:`tools_for` is a cheap,
    non-blocking snapshot in a stable order. :meth:`health` says how each part is, by name
    (for the full ``/healthz``): cheap, non-blocking, JSON-ready and secret-free (no URLs,
    headers or error texts). :meth:`start` returns once each part has come up or failed once
    (never raising for one part's failure); :meth:`aclose` is idempotent and stops everything
    the source started.
    """

    @property
    def generation(self) -> int: ...

    def tools_for(self, tenant: str) -> Sequence[Tool]: ...

    def health(self) -> Mapping[str, Mapping[str, Any]]: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


def schema_of(tool: Tool) -> Mapping[str, Any]:
    """The schema a provider receives for ``tool`` (and the ``tools`` entry records)."""
    return {"name": tool.name, "description": tool.description,
            "input_schema": dict(tool.input_schema)}


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
