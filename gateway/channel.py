"""The channel seam: how a platform hands messages in and gets replies out.

A channel adapter turns platform updates into :class:`gateway.messages.Inbound` and awaits
``deliver(inbound)`` (the router's entry point); replies come back through a
:class:`ReplySink` the channel opens per inbound message. Platforms that edit messages to
stream (Telegram, Slack) implement ``send``/``edit`` and get throttled streaming from
:class:`channels.streaming.EditStreamer`; platforms with their own stream (web SSE, a terminal)
implement the sink directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from aiohttp import web

from gateway.messages import Inbound, OutboundFile


@dataclass(frozen=True, slots=True)
class Accepted:
    """What ``deliver`` tells the channel: where the message was recorded."""

    session_id: str | None
    duplicate: bool = False


class RouterClosedError(RuntimeError):
    """The router is shutting down and takes no new messages."""


class ReplySink(Protocol):
    """Where one turn's reply goes.

    Contract: :meth:`delta` may be called any number of times with streamed text (possibly
    never); then exactly one of :meth:`finish` (the complete final text, which supersedes the
    deltas) or :meth:`fail` (a short apology) is called. :meth:`typing` may be called while the
    turn runs. None of them raise for delivery problems: a channel logs and counts those.
    """

    async def typing(self) -> None: ...

    async def delta(self, text: str) -> None: ...

    async def finish(self, text: str) -> None: ...

    async def fail(self, text: str) -> None: ...


@runtime_checkable
class FileSink(Protocol):
    """A reply sink that can also deliver a file (Telegram document, Slack upload, web
    download link, console listing).

    Contract: :meth:`send_file` delivers ``file`` to the person now, as its own message, while
    the turn goes on; it raises :class:`gateway.errors.ChannelError` when the platform refused
    it (the tool reports that to the model) and never for a text stream still open.
    """

    async def send_file(self, file: OutboundFile) -> None: ...


class Deliver(Protocol):
    """The router's entry point as channels see it (behind access control).

    Records ``inbound`` in its session and queues its turn; the reply goes to ``sink`` when
    given, else to the channel's :meth:`Channel.reply_sink`. Returns once recorded.
    """

    def __call__(self, inbound: Inbound, sink: ReplySink | None = None) -> Awaitable[object]: ...


class Channel(Protocol):
    """A platform adapter.

    Contract: :meth:`start` begins taking input and returns once the channel is running
    (background tasks live in a task group the channel owns); every inbound message is awaited
    into ``deliver``. :meth:`reply_sink` opens the sink for one inbound message. :meth:`health`
    is cheap and secret-free (it is served on ``/healthz``). :meth:`aclose` stops taking input,
    cancels the channel's tasks and is idempotent.
    """

    name: str

    async def start(self, deliver: Deliver) -> None: ...

    def reply_sink(self, inbound: Inbound) -> ReplySink: ...

    def health(self) -> Mapping[str, Any]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class HttpChannel(Protocol):
    """A channel that serves HTTP endpoints on the gateway's server (web, webhooks)."""

    def routes(self) -> Iterable[web.AbstractRouteDef]: ...
