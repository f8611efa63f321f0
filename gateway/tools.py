"""The tool seam: tools the model can call, and the registry the agent loop uses.

A tool is a name, a JSON schema and an async function from the model's input to a text result.
Its schema goes to the provider verbatim (and into the log as a ``tools`` entry). A tool that
delivers something to the person (``send_file``) is a :class:`ReplyTool`: it also gets the
turn's reply sink.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gateway.channel import ReplySink
from gateway.errors import ToolError
from gateway.messages import ChannelContext


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool answers. ``attachments`` are content blocks recorded with the text in the
    tool result (references to files the tool stored, e.g. one it sent)."""

    text: str
    is_error: bool = False
    attachments: tuple[Mapping[str, Any], ...] = ()

    def content(self) -> str | list[dict[str, Any]]:
        """The ``tool_result`` content: the text, or the text and the attachment blocks."""
        if not self.attachments:
            return self.text
        return [{"type": "text", "text": self.text}, *(dict(a) for a in self.attachments)]


class Tool(Protocol):
    """A callable tool. Contract: :meth:`run` raises :class:`ToolError` for a bad request;
    any other exception is a bug, reported to the model as an error result and logged."""

    name: str
    description: str
    input_schema: Mapping[str, Any]

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult: ...


@runtime_checkable
class ReplyTool(Protocol):
    """A tool that delivers to the person through the turn's reply sink (send_file). Its
    :meth:`run_replying` is called instead of ``run`` when there is a sink."""

    async def run_replying(self, args: Mapping[str, Any], context: ChannelContext,
                           sink: ReplySink) -> ToolResult: ...


class ToolRegistry:
    """An ordered set of tools; :attr:`schemas` is the exact list sent to the provider."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        self._tools = {t.name: t for t in tools}
        # One tuple object for the registry's lifetime: persist caches its fingerprint by identity.
        self.schemas: tuple[Mapping[str, Any], ...] = tuple(
            {"name": t.name, "description": t.description, "input_schema": dict(t.input_schema)}
            for t in tools
        )

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    async def run(self, name: str, args: Mapping[str, Any], context: ChannelContext, *,
                  sink: ReplySink | None = None) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult(f"unknown tool {name!r}", is_error=True)
        try:
            if sink is not None and isinstance(tool, ReplyTool):
                return await tool.run_replying(args, context, sink)
            return await tool.run(args, context)
        except ToolError as exc:
            return ToolResult(str(exc), is_error=True)
