"""The tool seam: tools the model can call and where they come from.

A tool is a name, a JSON schema and an async function from the model's input to a result. Its
schema goes to the provider verbatim (and into the log as a ``tools`` entry). A tool that
delivers something to the person (``send_file``) is a :class:`ReplyTool`: it also gets the
turn's reply sink. A tool may also answer with files the model should see (an MCP server's
screenshot): they come back as :class:`ToolMedia` and a :class:`MediaKeeper` stores them before
the result is recorded, so the log holds references, never bytes. Built-in tools (the
persona's) are fixed; a :class:`ToolSource` (the MCP servers of ``toolsets/``) adds tools that
may come and go while the gateway runs and that some tenants may not see. The registry that
answers "which tools does a call of this tenant offer" is :mod:`gateway.agent.tools`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gateway.edge.channel import ReplySink
from gateway.edge.messages import ChannelContext

OUTCOMES = ("ok", "error", "timeout", "oversize", "unavailable", "unknown", "crash")
"""How a tool call ended, as recorded and counted: the tool answered (``ok``), said it failed
(``error``), took too long, answered more than the size cap, its server is down, the model
named a tool the call did not offer, or the tool raised something it should not have."""

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
