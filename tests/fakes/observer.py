"""A turn observer that records what it is told, in order (a fake of gateway.edge.observe)."""

from __future__ import annotations

from typing import Any

from gateway.edge import logctx
from gateway.edge.observe import (
    CallHandle,
    CallInfo,
    CallResult,
    ToolHandle,
    ToolInfo,
    TurnHandle,
    TurnInfo,
)


class RecordingObserver:
    """``events``: one tuple per report, with the log context bound when it was made."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.calls: list[CallInfo] = []
        self.results: list[CallResult] = []
        self.closed = 0

    def turn_started(self, turn: TurnInfo) -> TurnHandle:
        self.events.append(("turn", turn.session, dict(logctx.current())))
        return _Turn(self)

    async def aclose(self) -> None:
        self.closed += 1


class _Turn:
    def __init__(self, owner: RecordingObserver) -> None:
        self.owner = owner

    def call_started(self, call: CallInfo) -> CallHandle:
        self.owner.calls.append(call)
        self.owner.events.append(("call", call.index, logctx.current().get("call")))
        return _Call(self.owner, call.index)

    def tool_started(self, tool: ToolInfo) -> ToolHandle:
        self.owner.events.append(("tool", tool.name, tool.call_id))
        return _Tool(self.owner, tool.name)

    def finished(self, status: str, latency: float) -> None:
        self.owner.events.append(("turn end", status))


class _Call:
    def __init__(self, owner: RecordingObserver, index: int) -> None:
        self.owner, self.index = owner, index

    def finished(self, result: CallResult) -> None:
        self.owner.results.append(result)
        self.owner.events.append(("call end", self.index, result.error))


class _Tool:
    def __init__(self, owner: RecordingObserver, name: str) -> None:
        self.owner, self.name = owner, name

    def finished(self, result: str, *, is_error: bool) -> None:
        self.owner.events.append(("tool end", self.name, is_error))
