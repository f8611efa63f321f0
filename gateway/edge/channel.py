"""The channel seam: how a platform hands messages in and gets replies out.

A channel adapter turns platform updates into :class:`gateway.edge.messages.Inbound` and awaits
``deliver(inbound)`` (the router's entry point); replies come back through a
:class:`ReplySink` the channel opens per inbound message. Platforms that edit messages to
stream (Telegram, Slack) implement ``send``/``edit`` and get throttled streaming from
:class:`channels.streaming.EditStreamer`; platforms with their own stream (web SSE, a terminal)
implement the sink directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from aiohttp import web

from gateway.edge.messages import Attachment, Inbound, OutboundFile


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer a message got, as recorded: ``ok`` False for an apology."""

    session_id: str
    ok: bool
    text: str


@dataclass(frozen=True, slots=True)
class Accepted:
    """What ``deliver`` tells the channel once the message is durably recorded (acknowledge
    it now).

    ``session_id`` is where it was recorded, when that is known already; otherwise
    ``recorded`` resolves to it once its turn records it (always before its reply is sent).
    ``duplicate``: the platform id was delivered before; nothing new was recorded and
    ``earlier(within)`` waits up to ``within`` seconds for the answer that delivery got
    (``None`` if it has none by then). ``answered(within)``, where the reply comes from
    another worker (relayed through Redis, and lost if Redis loses its keys meanwhile), looks
    the same way for this message's own answer as recorded, for a channel still waiting.
    """

    session_id: str | None
    duplicate: bool = False
    recorded: asyncio.Future[str] | None = None
    earlier: Callable[[float], Awaitable[Answer | None]] | None = None
    answered: Callable[[float], Awaitable[Answer | None]] | None = None

    async def session(self, within: float) -> str | None:
        """The session id, waiting up to ``within`` seconds for the record if needed."""
        if self.session_id is not None or self.recorded is None:
            return self.session_id
        done, _ = await asyncio.wait([self.recorded], timeout=within)
        if not done or self.recorded.cancelled():
            return None
        return self.recorded.result()


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
    the turn goes on; it raises :class:`gateway.edge.errors.ChannelError` when the platform refused
    it (the tool reports that to the model) and never for a text stream still open.
    """

    async def send_file(self, file: OutboundFile) -> None: ...


@runtime_checkable
class RetractSink(Protocol):
    """A reply sink that can take back what it streamed of an answer that will not come.

    Contract: :meth:`retract` is called at most once, instead of :meth:`ReplySink.finish` /
    :meth:`ReplySink.fail`, when the turn's final reply is abandoned: the worker lost the
    conversation's lease (or stopped) before the answer was saved, and the conversation's
    next holder answers instead. It removes the preview of the partial answer (Telegram
    ``deleteMessage``, Slack ``chat.delete`` and its typing reaction, the web page's
    streamed bubble), so the person does not read a half answer above the full one. It
    never raises: a failure to remove is logged once and counted by the channel. With
    nothing shown it does nothing. Optional: a sink without it (the console: a terminal
    cannot take printed text back, and one process never loses a lease) leaves the preview.
    """

    async def retract(self) -> None: ...


@runtime_checkable
class FetchChannel(Protocol):
    """A channel whose files are downloaded after the message is acknowledged.

    Contract: it hands such files in as attachments with a ``ref`` (plain data saying where
    the file is; see :class:`gateway.edge.messages.Attachment`), and :meth:`fetch_file` downloads
    one when the message's turn starts, possibly in a later run of the gateway (the ref was
    kept with the owed message). It returns the attachment with its bytes, or with a
    ``problem`` (``download-failed``, ``too-large``) when it could not be fetched, so the
    person is told; it never raises for a failed download. Optional: channels without it
    download before the message is recorded (``Attachment.fetch``).
    """

    async def fetch_file(self, attachment: Attachment) -> Attachment: ...


@runtime_checkable
class ProactiveChannel(Protocol):
    """A channel that speaks first (a reminder, a schedule, a heartbeat), by its platform's rules.

    Contract: :attr:`starts_conversations` is True when the platform lets the bot write to a
    chat that never wrote to it (Slack, in its workspace); False when it does not (Telegram:
    only chats that have talked to the bot), and then a scheduled turn goes only to a
    conversation with a session. :meth:`direct_chat` is the chat id of the bot's one-to-one
    chat with ``person`` (Slack: ``conversations.open``), ``None`` when it cannot be had
    (logged by the channel); it never raises for the platform's refusals. Channels without
    it: nobody is written to first, and a person's chat id is their id.
    """

    starts_conversations: bool

    async def direct_chat(self, person: str, tenant: str) -> str | None: ...


class Deliver(Protocol):
    """The router's entry point as channels see it (behind access control).

    Records ``inbound`` durably and queues its turn; the reply goes to ``sink`` when given,
    else to the channel's :meth:`Channel.reply_sink`. Returns :class:`Accepted` once recorded
    (acknowledge it then), ``None`` when access control refused it. Raises
    :class:`~gateway.edge.errors.UnavailableError` when it could not be recorded and
    :class:`RouterClosedError` when the gateway is stopping: then do not acknowledge it.
    """

    def __call__(self, inbound: Inbound, sink: ReplySink | None = None) -> Awaitable[object]: ...


class Channel(Protocol):
    """A platform adapter.

    Contract: :meth:`start` begins taking input and returns once the channel is running
    (background tasks live in a task group the channel owns); every inbound message is awaited
    into ``deliver``. :meth:`reply_sink` opens the sink for one inbound message. :meth:`health`
    is cheap and secret-free (it is served on ``/healthz``): ``ok``, and, in a channel that
    reports ``last_error``, a short reason whenever ``ok`` is false (never null then).
    :meth:`aclose` stops taking input,
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
