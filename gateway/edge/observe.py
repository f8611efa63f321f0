"""The observer seam: what a tracer sees of a turn, its provider calls and its tool calls.

Words: a **turn** is one inbound message answered (every provider call and tool call until the
reply); a **call** is one provider request. The agent loop reports both through a
:class:`TurnObserver` chosen by the composition root (OpenTelemetry in ``app/telemetry.py``,
nothing by default), so the core never imports a tracing SDK.

Contract: every ``*_started`` returns a handle whose ``finished`` the loop calls exactly once,
on every path (a cancelled turn finishes with status ``cancelled``). Observers must not raise
and must not block: they run on the event loop, inside the turn. Content (prompts, messages,
tool arguments and results) is handed over in :class:`CallInfo`/:class:`ToolInfo` and the
observer alone decides whether to keep it (the GenAI conventions make that opt-in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sessions.records import MessageDict, ToolSchema


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """Whose turn it is: the log-context fields, also the turn span's attributes."""

    tenant: str
    channel: str
    conversation: str
    session: str
    inbound: int | None = None
    """The index of the message the turn answers: its trace's ids are derived from it
    (:mod:`sessions.traces`), so an export of the log gives the same ones."""


@dataclass(frozen=True, slots=True)
class CallInfo:
    """One provider call about to be sent (``index``: the session's call number, from 1)."""

    index: int
    provider: str
    model: str
    params: Mapping[str, Any]
    system: str
    messages: Sequence[MessageDict]
    tools: Sequence[ToolSchema]
    entry: int | None = None
    """The number of the ``call`` entry recorded for it (its span id is derived from it);
    None when the log refused the call."""


@dataclass(frozen=True, slots=True)
class CallResult:
    """How a call ended: an answer (``message``) or an error kind; latency in seconds."""

    latency: float
    message: MessageDict | None = None
    stop_reason: str | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    response_id: str | None = None
    response_model: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """One tool call the model asked for."""

    name: str
    call_id: str
    arguments: Mapping[str, Any]


class CallHandle(Protocol):
    def finished(self, result: CallResult) -> None:
        """The call ended (answer or error); called once."""
        ...


class ToolHandle(Protocol):
    def finished(self, result: str, *, is_error: bool) -> None:
        """The tool returned ``result`` (an error result when ``is_error``); called once."""
        ...


class TurnHandle(Protocol):
    def call_started(self, call: CallInfo) -> CallHandle: ...

    def tool_started(self, tool: ToolInfo) -> ToolHandle: ...

    def finished(self, status: str, latency: float) -> None:
        """The turn ended: ``answered``, ``apologised``, ``iteration_cap``, ``error`` or
        ``cancelled``; latency in seconds. Called once."""
        ...


class TurnObserver(Protocol):
    """Sees every turn. :meth:`aclose` flushes what is buffered; idempotent."""

    def turn_started(self, turn: TurnInfo) -> TurnHandle: ...

    async def aclose(self) -> None: ...


class _Nothing:
    """Observes nothing (the default): every handle is itself."""

    def turn_started(self, turn: TurnInfo) -> TurnHandle:
        return self

    def call_started(self, call: CallInfo) -> CallHandle:
        return self

    def tool_started(self, tool: ToolInfo) -> ToolHandle:
        return self

    def finished(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def aclose(self) -> None:
        return None


NO_OBSERVER: TurnObserver = _Nothing()
