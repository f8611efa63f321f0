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


@dataclass(frozen=True, slots=True)
class Placed:
    """One platform message that carries (part of) an answer: ``part`` 0 is the first (the
    preview is part 0 too), then each further chunk of a long answer; ``ref`` is plain JSON
    data only the channel reads (Telegram's chat and message id, Slack's channel and ts)."""

    part: int
    ref: Mapping[str, Any]


class Placement(Protocol):
    """Where the core keeps the platform messages of one item's answer (see
    :class:`PlacingSink`).

    ``item`` is the item's id, for a platform that carries data with a message (Slack's
    message metadata). ``known`` are the messages noted for this answer by an earlier run or
    holder: they exist on the platform (unless someone deleted them), and the answer is
    finished by editing them. ``resumed``: an earlier run may have sent messages it did not
    live to note; a platform that can look its own messages up does so before it sends.
    :meth:`note` makes one message's ref durable (in the item's session log) before it
    returns: True once it is, False when the log could not take it (then a crash before the
    answer is marked answered may leave that message behind, unnoted). It never raises for a
    store problem. With ``wait=False`` it returns once the log has accepted the ref, which is
    written in order with the conversation's next entries: for a message that already holds
    its text and that the platform can find again by the item (a resumed turn searches for
    it), so a kill before the ref is written costs nothing and the turn need not wait.
    """

    @property
    def item(self) -> str: ...

    @property
    def known(self) -> tuple[Placed, ...]: ...

    @property
    def resumed(self) -> bool: ...

    async def note(self, part: int, ref: Mapping[str, Any], *, wait: bool = True) -> bool: ...


@runtime_checkable
class PlacingSink(Protocol):
    """A reply sink that reconciles an answer with the platform instead of sending it again.

    Contract: :meth:`place` is called at most once per sink, before any other method (a sink
    never placed behaves as a plain :class:`ReplySink`). From then on no text of the answer
    goes into a platform message before that message is noted (:meth:`Placement.note`):
    Telegram sends a placeholder, notes its id and then edits the text in; Slack posts with
    the item id in the message's metadata and notes the ts right after (a message it did not
    live to note is found again by that metadata). A message in ``Placement.known`` is
    edited into the answer, never sent again; one the platform no longer has (deleted) is
    replaced by a new one, noted the same way. So after any crash the person sees at most a
    stray placeholder (its id never noted), never a second complete answer.
    """

    def place(self, placement: Placement) -> None: ...


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
