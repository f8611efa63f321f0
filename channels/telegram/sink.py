"""Replies to Telegram: Bot API calls made safe, and the :class:`EditTarget` of one inbound.

:class:`BotApi` wraps the bot for everything outbound: with ``TELEGRAM_RATE_LIMIT=off`` it
honours a 429's ``retry_after`` once itself (with the rate limiter on, ``AIORateLimiter``
retries); failures are logged as one line with a short kind and counted in
``gateway_channel_errors_total{channel="telegram"}``. PTB's request URLs and some of its
exception texts contain the bot token, so nothing from PTB is logged or re-raised unredacted.

:class:`TelegramTarget` is what :class:`channels.streaming.EditStreamer` drives: typing
actions, a plain-text preview message that is edited while the reply streams, and the final
text rendered once with :func:`channels.telegram.render.render_chunks` and sent as
``parse_mode=HTML``: the preview is edited into the first chunk, later chunks are new messages.
A reply abandoned instead (another worker answers) has its preview deleted (``deleteMessage``).
Everything goes into the user's forum topic, and in groups replies to the user's message. A
chunk Telegram refuses to parse ("can't parse entities") is sent again as its plain text.

Reconciled (:class:`gateway.edge.channel.PlacingSink`): once the core has placed the reply,
no text of the answer goes into a message whose id is not noted in the log. Each message
that will carry part of it (the first, which a preview is too, and each further chunk) is
sent as a placeholder (:data:`PLACEHOLDER`), its id noted, and then edited into its text; a
message an earlier run noted is edited, never sent again (one the person deleted meanwhile
is replaced, the same way). Telegram gives a bot no way to find its own messages again, so
what remains is a placeholder whose ``sendMessage`` returned just before a kill, with its id
not yet in the log: the person sees "…" above the answer, never the answer twice.
A reply complete within ``preview_after`` seconds of the turn's start is sent once, without
a preview (fewer calls against the rate limits, no flicker). Preview edits never hold up the
turn: while one edit is in flight (say, queued by the rate limiter) newer previews are
skipped, and the final delivery waits for it to land first.
"""

from __future__ import annotations

import asyncio
import datetime as dtm
import html
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

from telegram import InputFile, Message, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.ext import ExtBot

from channels.telegram.render import TelegramChunk, render_chunks
from gateway.edge.channel import Placement
from gateway.edge.errors import ChannelError, Failure
from gateway.edge.messages import OutboundFile
from gateway.edge.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")
TelegramBot = ExtBot[int]
"""The bot type: ``ExtBot`` with an optional ``AIORateLimiter`` (whose args are an int)."""

REDACTED: Final = "***"
PLACEHOLDER: Final = "…"
"""The first text of every message that will carry an answer (see the module docstring)."""
DELIVERY_TRIES: Final = 3
RETRY_BACKOFF: Final = 0.5
"""A placed answer's calls are tried this many times, this many seconds apart (doubling)."""
TRANSIENT: Final = frozenset({"timeout", "network"})
"""Failure kinds (:func:`error_kind`) that may pass: PTB's timeouts, connection errors, 5xx."""
MAX_RETRY_AFTER: Final = 60.0
"""Longest 429 wait honoured inline; a longer one fails the call rather than hang a turn."""


def error_kind(exc: BaseException) -> str:
    """A short, secret-free name for a Bot API failure (for logs, metrics and health)."""
    if isinstance(exc, RetryAfter):
        return Failure.RATE_LIMITED
    if isinstance(exc, Conflict):
        return Failure.CONFLICT
    if isinstance(exc, InvalidToken):
        return Failure.UNAUTHORIZED
    if isinstance(exc, Forbidden):
        return Failure.FORBIDDEN
    if isinstance(exc, BadRequest):  # before NetworkError: PTB derives it from NetworkError
        return Failure.BAD_REQUEST
    if isinstance(exc, TimedOut):
        return Failure.TIMEOUT
    if isinstance(exc, NetworkError):
        return Failure.NETWORK
    if isinstance(exc, TelegramError):
        return Failure.TELEGRAM
    return Failure.ERROR


def retry_after_seconds(exc: RetryAfter) -> float:
    """``retry_after`` in seconds, whether PTB hands out an int or (PTB_TIMEDELTA) a timedelta."""
    value = exc.retry_after
    return value.total_seconds() if isinstance(value, dtm.timedelta) else float(value)


class BotApi:
    """Outbound calls with the 429 policy, token-free error logging and error counting."""

    def __init__(self, bot: TelegramBot, metrics: Metrics, token: str, *,
                 retry_429: bool) -> None:
        self.bot = bot
        self.metrics = metrics
        self._token = token
        self.retry_429 = retry_429

    def redact(self, text: str) -> str:
        return text.replace(self._token, REDACTED) if self._token else text

    def describe(self, exc: BaseException) -> str:
        """``Kind: message`` of an exception, with the token removed."""
        return self.redact(f"{type(exc).__name__}: {exc}")

    def failed(self, what: str, exc: BaseException) -> None:
        """Log one line and count the failure; never raises."""
        kind = error_kind(exc)
        self.metrics.channel_errors.labels(channel="telegram", kind=kind).inc()
        log.warning("telegram %s failed (%s: %s)", what, kind, self.describe(exc))

    async def request(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run one call; without the rate limiter a 429 is waited out and retried once."""
        try:
            return await make()
        except RetryAfter as exc:
            wait = retry_after_seconds(exc)
            if not self.retry_429 or wait > MAX_RETRY_AFTER:
                raise
            self.metrics.channel_errors.labels(channel="telegram", kind=Failure.RATE_LIMITED).inc()
            log.info("telegram: flood control, retrying in %.1f s", wait)
            await asyncio.sleep(wait)
        return await make()


def is_parse_error(exc: BadRequest) -> bool:
    return "can't parse entities" in exc.message.lower()


def is_not_modified(exc: BadRequest) -> bool:
    return "message is not modified" in exc.message.lower()


def is_gone(exc: BaseException) -> bool:
    """The message to edit is not there any more (deleted by the person, or retracted)."""
    return isinstance(exc, BadRequest) and "message to edit not found" in exc.message.lower()


def _message_id(ref: Mapping[str, Any], chat_id: int) -> int | None:
    """The message id a ``delivery`` ref names in this chat (None: not one of ours)."""
    message, chat = ref.get("message"), ref.get("chat")
    return message if type(message) is int and chat == chat_id else None


class TelegramTarget:
    """The :class:`channels.streaming.EditTarget` of one inbound message."""

    def __init__(self, api: BotApi, chat_id: int, *, thread_id: int | None = None,
                 reply_to: int | None = None, preview_after: float = 0.0,
                 on_begin: Callable[[], None] | None = None,
                 on_done: Callable[[], None] | None = None) -> None:
        """``on_begin``/``on_done`` bracket the final reply's delivery (always both, once)."""
        self.api = api
        self.chat_id = chat_id
        self.thread_id = thread_id
        self.reply_to = reply_to
        self.preview_after = preview_after
        self.on_begin = on_begin
        self.on_done = on_done
        self._started: float | None = None  # the turn's start: its first typing action
        self._edit: asyncio.Task[None] | None = None
        self._preview_text: str | None = None
        self._placement: Placement | None = None
        self._parts: dict[int, int] = {}  # part -> message id noted for it
        self._transient = False  # the last failed call may work when tried again

    def place(self, placement: Placement) -> None:
        """Reconcile with what the log noted (see the module docstring)."""
        self._placement = placement
        self._parts = {p.part: m for p in placement.known
                       if (m := _message_id(p.ref, self.chat_id)) is not None}

    @property
    def _bot(self) -> TelegramBot:
        return self.api.bot

    def _reply(self) -> ReplyParameters | None:
        if self.reply_to is None:
            return None
        return ReplyParameters(message_id=self.reply_to, allow_sending_without_reply=True)

    async def typing(self) -> None:
        if self._started is None:
            self._started = time.monotonic()
        try:
            await self.api.request(lambda: self._bot.send_chat_action(
                self.chat_id, ChatAction.TYPING, message_thread_id=self.thread_id))
        except Exception as exc:  # delivery problems are logged, never raised into a turn
            self.api.failed("sendChatAction", exc)

    async def send_preview(self, text: str) -> str | None:
        now = time.monotonic()
        if self._started is None:
            self._started = now
        if now - self._started < self.preview_after:
            return None  # still young: the streamer asks again with the next delta
        if self._placement is not None:
            shown = await self._fill(0, text)
            if shown is None:
                return None
            self._preview_text = text
            return str(shown)
        message = await self._send(text, None, what="preview")
        if message is None:
            return None
        self._preview_text = text
        return str(message.message_id)

    async def edit_preview(self, ref: str, text: str) -> None:
        if self._edit is not None and not self._edit.done():
            return  # the next delta carries newer text anyway
        self._edit = asyncio.get_running_loop().create_task(self._edit_plain(int(ref), text))

    async def _edit_plain(self, message_id: int, text: str) -> None:
        try:
            await self._edit_text(message_id, text, None)
            self._preview_text = text
        except Exception as exc:  # delivery problems are logged, never raised into a turn
            if not (isinstance(exc, BadRequest) and is_not_modified(exc)):
                self.api.failed("editMessageText (preview)", exc)

    async def deliver_final(self, text: str, preview: str | None) -> None:
        if self.on_begin is not None:
            self.on_begin()
        try:
            if self._edit is not None:
                await asyncio.wait([self._edit])  # the last preview edit lands first
            chunks = render_chunks(text)
            if not chunks:
                return
            if self._placement is not None:
                await self._deliver_placed(chunks, preview)
                return
            head, *rest = chunks
            edited = preview is not None and await self._edit_into(int(preview), head,
                                                                   self._preview_text)
            if not edited and not await self._send_chunk(head):
                return
            for chunk in rest:
                if not await self._send_chunk(chunk):
                    return  # later chunks would read out of context without this one
        finally:
            if self.on_done is not None:
                self.on_done()

    async def _deliver_placed(self, chunks: list[TelegramChunk], preview: str | None) -> None:
        """Each chunk into the message noted for its part (opened now, as a placeholder, when
        there is none); stops at the first that cannot be delivered. A call that failed on
        the way (a timeout, a network error, a 5xx) is tried again, :data:`DELIVERY_TRIES`
        times in all: an edit is the same however often it lands, and a placeholder sent
        twice is a stray "…" at worst, while an answer given up on is one the item is
        marked answered for anyway (found under load, where a full connection pool times
        calls out)."""
        if preview is not None:
            self._parts.setdefault(0, int(preview))
        for part, chunk in enumerate(chunks):
            for attempt in range(DELIVERY_TRIES):
                self._transient = False
                if await self._place_chunk(part, chunk):
                    break
                if not self._transient or attempt == DELIVERY_TRIES - 1:
                    return  # later chunks would read out of context without this one
                await asyncio.sleep(RETRY_BACKOFF * 2 ** attempt)

    async def _place_chunk(self, part: int, chunk: TelegramChunk) -> bool:
        message = await self._opened(part)
        if message is None:
            return False
        done = await self._edit_into(message, chunk, self._preview_text if part == 0 else None)
        if done is None:  # gone (deleted meanwhile): a new placeholder takes its place
            self._parts.pop(part, None)
            message = await self._opened(part)
            done = message is not None and await self._edit_into(message, chunk) is True
        return bool(done)

    async def _fill(self, part: int, text: str) -> int | None:
        """Show plain ``text`` (a preview) in the message of ``part``; its id."""
        for _ in range(2):
            message = await self._opened(part)
            if message is None:
                return None
            try:
                await self._edit_text(message, text, None)
                return message
            except BadRequest as exc:
                if is_not_modified(exc):
                    return message
                if not is_gone(exc):
                    self.api.failed("editMessageText (preview)", exc)
                    return None
                self._parts.pop(part, None)  # deleted meanwhile: open a new one
            except Exception as exc:  # delivery problems are logged, never raised into a turn
                self.api.failed("editMessageText (preview)", exc)
                return None
        return None

    async def _opened(self, part: int) -> int | None:
        """The message that carries ``part``: the one noted for it, or a placeholder sent
        now and noted (durably) before any text goes in. None when it cannot be sent."""
        known = self._parts.get(part)
        if known is not None:
            return known
        assert self._placement is not None
        message = await self._send(PLACEHOLDER, None, what="placeholder")
        if message is None:
            return None
        self._parts[part] = message.message_id
        await self._placement.note(part, {"chat": self.chat_id, "message": message.message_id})
        return message.message_id

    async def retract(self, preview: str | None) -> None:
        """``deleteMessage`` the preview of a reply that will not be finished here (another
        worker answers); a failure is logged once and counted, never raised."""
        if preview is None:
            return  # nothing shown; the typing action fades by itself
        if self.on_begin is not None:
            self.on_begin()
        try:
            if self._edit is not None:
                await asyncio.wait([self._edit])  # an edit landing after the delete would fail
            await self.api.request(lambda: self._bot.delete_message(self.chat_id, int(preview)))
        except Exception as exc:  # delivery problems are logged, never raised into a turn
            self.api.failed("deleteMessage (preview)", exc)
        finally:
            if self.on_done is not None:
                self.on_done()

    async def send_file(self, file: OutboundFile) -> None:
        """``sendDocument`` into the person's chat (and topic); ChannelError if refused."""
        try:
            await self.api.request(lambda: self._bot.send_document(
                self.chat_id, InputFile(file.data, filename=file.name),
                message_thread_id=self.thread_id, reply_parameters=self._reply()))
        except Exception as exc:
            self.api.failed("sendDocument", exc)
            raise ChannelError(f"telegram refused the file ({error_kind(exc)})") from None

    async def _edit_into(self, message_id: int, chunk: TelegramChunk,
                         shown: str | None = None) -> bool | None:
        """Turn the message (showing plain ``shown``, if known) into ``chunk``; False if a new
        message must be sent instead (None: the message is gone)."""
        if chunk.plain == shown and chunk.html == html.escape(chunk.plain, False):
            return True  # the preview already shows exactly this
        for parse_mode, body in ((ParseMode.HTML, chunk.html), (None, chunk.plain)):
            try:
                await self._edit_text(message_id, body, parse_mode)
                return True
            except BadRequest as exc:
                if is_not_modified(exc):
                    return True
                if is_gone(exc):
                    return None
                if parse_mode is not None and is_parse_error(exc):
                    log.warning("telegram: HTML refused (%s); sending plain text",
                                self.api.describe(exc))
                    self.api.metrics.channel_errors.labels(channel="telegram",
                                                           kind=Failure.HTML_REFUSED).inc()
                    continue
                self.api.failed("editMessageText (final)", exc)
                return False
            except Exception as exc:  # delivery problems are logged, never raised into a turn
                self.api.failed("editMessageText (final)", exc)
                self._transient = error_kind(exc) in TRANSIENT
                return False
        return False

    async def _send_chunk(self, chunk: TelegramChunk) -> bool:
        return await self._send(chunk.html, ParseMode.HTML, what="reply",
                                plain=chunk.plain) is not None

    async def _send(self, text: str, parse_mode: str | None, *, what: str,
                    plain: str | None = None) -> Message | None:
        """Send one message; an HTML parse error is retried once as ``plain`` text."""
        try:
            return await self.api.request(lambda: self._bot.send_message(
                self.chat_id, text, parse_mode=parse_mode, message_thread_id=self.thread_id,
                reply_parameters=self._reply()))
        except BadRequest as exc:
            if plain is None or parse_mode is None or not is_parse_error(exc):
                self.api.failed(f"sendMessage ({what})", exc)
                return None
            log.warning("telegram: HTML refused (%s); sending plain text",
                        self.api.describe(exc))
            self.api.metrics.channel_errors.labels(channel="telegram",
                                                   kind=Failure.HTML_REFUSED).inc()
            return await self._send(plain, None, what=what)
        except Exception as exc:  # delivery problems are logged, never raised into a turn
            self.api.failed(f"sendMessage ({what})", exc)
            self._transient = error_kind(exc) in TRANSIENT
            return None

    async def _edit_text(self, message_id: int, text: str, parse_mode: str | None) -> None:
        await self.api.request(lambda: self._bot.edit_message_text(
            text, chat_id=self.chat_id, message_id=message_id, parse_mode=parse_mode))
