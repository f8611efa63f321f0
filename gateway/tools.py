"""The tool seam: tools the model can call, and the registry the agent loop uses.

A tool is a name, a JSON schema and an async function from the model's input to a text result.
Its schema goes to the provider verbatim (and into the log as a ``tools`` entry).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.errors import ToolError
from gateway.messages import ChannelContext


@dataclass(frozen=True, slots=True)
class ToolResult:
    text: str
    is_error: bool = False


class Tool(Protocol):
    """A callable tool. Contract: :meth:`run` raises :class:`ToolError` for a bad request;
    any other exception is a bug, reported to the model as an error result and logged."""

    name: str
    description: str
    input_schema: Mapping[str, Any]

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult: ...


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

    async def run(self, name: str, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult(f"unknown tool {name!r}", is_error=True)
        try:
            return await tool.run(args, context)
        except ToolError as exc:
            return ToolResult(str(exc), is_error=True)
