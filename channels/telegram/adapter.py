"""The Telegram channel: python-telegram-bot 22 driven inside the gateway's own event loop.

No ``Application``/``Updater``: an :class:`telegram.ext.ExtBot` (``base_url`` from
``TELEGRAM_API_BASE_URL`` for a self-hosted Bot API server; its requests go over aiohttp,
:mod:`channels.telegram.request`, cheaper per message than PTB's httpx default) is used
as a plain client. Outbound calls follow Telegram's published limits through
``AIORateLimiter`` (about 30 messages/s per bot, 20/min per group; a 429 is retried after its
``retry_after``); ``TELEGRAM_RATE_LIMIT=off`` removes the limiter and a 429 is then waited out
and retried once (:class:`channels.telegram.sink.BotApi`).

Input, by ``TELEGRAM_MODE``: long polling (:mod:`channels.telegram.polling`, the default) or
a webhook on the gateway's server (:mod:`channels.telegram.webhook`; needs
``TELEGRAM_WEBHOOK_SECRET``; with ``TELEGRAM_WEBHOOK_URL`` the webhook is registered at start,
otherwise it is the operator's job). Every update goes through :meth:`TelegramChannel.handle`:
pure conversion (:mod:`channels.telegram.convert`), then ``deliver`` (the access gate in front
of the router), which returns once the message is durably recorded; a redelivered update (a
crash or restart cut its confirmation off) is recognised there, by the router's one duplicate
check, and not answered again. Only then is the update confirmed (the polling offset moves
past it, a webhook gets its 200). When the store cannot record it, or the gateway is
stopping, the update is not confirmed: polling holds its offset and asks again after a pause
(or stops), a webhook gets a 503 with ``Retry-After``; Telegram delivers it again. An update
that fails for any other reason (a bug) is logged, counted and dropped at most once: one bad
update never wedges the poll.

Several workers (``GATEWAY_REDIS_URL``): in polling mode only the elected leader polls (two
pollers of one bot would fight with 409 Conflicts); the others stand by and take over when the
leader's lease lapses. Each term polls from Telegram's oldest unconfirmed update: those the old
leader already handed in are duplicates to the router. Webhook mode runs on every worker.

Files are not downloaded before the update is confirmed: polling handles updates one after
another (and a webhook's answer waits for its update), so one person's large photo would hold
every other chat's messages, and the next ``getUpdates``, behind its download. The message is
owed with references to its files (their ``file_id``, :mod:`channels.telegram.files`), and the
core calls :meth:`TelegramChannel.fetch_file` as the message's turn starts, so the download is
part of that conversation's turn only; a crash after the confirmation leaves the references in
the owed journal for the next start to fetch. A download that fails then gets the person a
reply saying the file could not be downloaded.

Access control comes first. A message the channel will not pass on (media it cannot read,
a text over the length limit) is still handed to ``deliver`` as an inbound carrying only a
``refusal``: the access gate decides on its sender like on any message, and only a sender it
admits is told why (a stranger gets the pairing reply, or nothing with pairing off).

Ids: a chat, topic or user id that is not an integer (only a request holding the webhook
secret could send one) is dropped with a warning before anything is recorded.

Replies: one :class:`channels.streaming.EditStreamer` per inbound message over a
:class:`channels.telegram.sink.TelegramTarget`. :meth:`TelegramChannel.aclose` stops input,
gives final replies still being written up to ``GATEWAY_SHUTDOWN_GRACE`` seconds, then closes
the bot. Only a final reply being delivered counts as "being written": a sink opened for a turn
that never ran (cancelled in the queue at shutdown) holds nothing up.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from aiohttp import web
from telegram import BotCommand, BotCommandScopeAllPrivateChats, Update
from telegram.ext import AIORateLimiter, ExtBot

from channels.streaming import TYPING_DELAY, EditStreamer
from channels.telegram.convert import CHANNEL, BotIdentity, GroupMode, Skip, to_inbound
from channels.telegram.files import fetch, file_base_url, with_files
from channels.telegram.polling import ALLOWED_UPDATES, Poller
from channels.telegram.request import AiohttpRequest
from channels.telegram.sink import BotApi, TelegramBot, TelegramTarget, error_kind
from channels.telegram.webhook import MalformedUpdateError, WebhookEndpoint
from gateway.edge import commands
from gateway.edge.channel import Deliver, ReplySink, RouterClosedError
from gateway.edge.coordination import LeaderElector
from gateway.edge.errors import ChannelError, ConfigError, Failure, UnavailableError
from gateway.edge.messages import Attachment, ConversationKey, Inbound, Sender
from gateway.edge.metrics import Metrics
from gateway.edge.tasks import stop

log = logging.getLogger(__name__)

DEFAULT_BASE_URL: Final = "https://api.telegram.org/bot"
RATE_LIMIT_RETRIES: Final = 3
_SECRET_CHARS = re.compile(r"[A-Za-z0-9_-]{1,256}")

Mode = Literal["polling", "webhook"]


@dataclass(frozen=True, slots=True)
class TelegramOptions:
    """Behaviour settings of the channel (``TELEGRAM_*``; see :meth:`from_settings`)."""

    mode: Mode = "polling"
    webhook_secret: str | None = None
    webhook_url: str | None = None
    group_mode: GroupMode = "mention"
    max_message_chars: int = 16_000
    poll_timeout: int = 30
    stall_seconds: float = 90.0
    edit_interval: float = 1.0
    typing_interval: float = 4.0
    typing_delay: float = TYPING_DELAY
    close_grace: float = 10.0
    max_attachment_bytes: int = 20 * 1024 * 1024


def build_bot(token: str, base_url: str | None, *, rate_limit: bool,
              base_file_url: str | None = None) -> TelegramBot:
    """The PTB client; no I/O until ``initialize``. Files are downloaded from
    ``base_file_url`` (see :func:`channels.telegram.files.file_base_url`)."""
    return ExtBot(
        token,
        base_url=base_url or DEFAULT_BASE_URL,
        base_file_url=file_base_url(base_url, base_file_url),
        # A few connections carry Telegram's ~30 messages/s; bursts wait for one in the pool.
        request=AiohttpRequest(8, read_timeout=15.0, pool_timeout=30.0),
        # Its own pool: a long poll never waits behind replies, nor replies behind it.
        # (its read timeout is set per call, see channels.telegram.polling).
        get_updates_request=AiohttpRequest(2),
        rate_limiter=AIORateLimiter(max_retries=RATE_LIMIT_RETRIES) if rate_limit else None,
    )


class TelegramChannel:
    """See the module docstring. Implements :class:`gateway.edge.channel.Channel`,
    :class:`gateway.edge.channel.FetchChannel` and, in webhook mode,
    :class:`gateway.edge.channel.HttpChannel`."""

    name = "telegram"

    def __init__(self, bot: TelegramBot, *, token: str, metrics: Metrics,
                 options: TelegramOptions,
                 rate_limited: bool = True, elector: LeaderElector | None = None) -> None:
        if options.mode == "webhook" and not options.webhook_secret:
            raise ConfigError("TELEGRAM_MODE=webhook needs TELEGRAM_WEBHOOK_SECRET")
        if options.webhook_secret and not _SECRET_CHARS.fullmatch(options.webhook_secret):
            raise ConfigError("TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of "
                              "A-Z, a-z, 0-9, _ and -")
        if options.mode == "polling" and options.stall_seconds <= options.poll_timeout:
            raise ConfigError("TELEGRAM_STALL_SECONDS must be longer than TELEGRAM_POLL_TIMEOUT")
        self.bot = bot
        self.options = options
        self.metrics = metrics
        self.api = BotApi(bot, metrics, token, retry_429=not rate_limited)
        self.edit_interval = options.edit_interval
        """Seconds before the first preview and between preview edits (public: tests set it)."""
        self.identity: BotIdentity | None = None
        self._deliver: Deliver | None = None
        self._closed = False
        self._open_replies = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.poll_observers: list[Callable[[], None]] = []
        """Called as each getUpdates is built (polling mode): what a test or a tracer sees
        of the polling rhythm (:class:`~channels.telegram.polling.Poller`'s ``on_poll``)."""
        self._poller: Poller | None = None
        self._webhook: WebhookEndpoint | None = None
        # Several workers: only the elected one polls (see the module docstring).
        self._elector = elector if options.mode == "polling" else None
        self._leading: asyncio.Task[None] | None = None
        if options.mode == "polling":
            self._poller = self._new_poller()
        else:
            assert options.webhook_secret is not None  # checked above
            self._webhook = WebhookEndpoint(
                options.webhook_secret, parse=self._parse, handle=self.handle,
                ready=lambda: self._deliver is not None and not self._closed, metrics=metrics)

    def _new_poller(self) -> Poller:
        return Poller(self.api, self.handle, poll_timeout=self.options.poll_timeout,
                      stall_seconds=self.options.stall_seconds, on_poll=self._polled)

    def _polled(self) -> None:
        for observer in self.poll_observers:
            observer()

    # -- lifecycle ------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [] if self._webhook is None else [self._webhook.route()]

    async def start(self, deliver: Deliver) -> None:
        if self._closed:
            raise ChannelError("the telegram channel is closed")
        try:
            await self.bot.initialize()  # getMe: checks the token, learns the bot's username
        except Exception as exc:
            raise ChannelError(
                f"telegram: getMe failed ({error_kind(exc)}); check TELEGRAM_BOT_TOKEN and "
                "TELEGRAM_API_BASE_URL"
            ) from self._safe_cause(exc)
        self.identity = BotIdentity(self.bot.id, self.bot.username)
        await self._set_menu()
        if self.options.mode == "webhook" and self.options.webhook_url:
            url, secret = self.options.webhook_url, self.options.webhook_secret
            try:
                await self.api.request(lambda: self.bot.set_webhook(
                    url, secret_token=secret, allowed_updates=list(ALLOWED_UPDATES)))
            except Exception as exc:
                raise ChannelError(
                    f"telegram: setWebhook failed ({error_kind(exc)}: {self.api.describe(exc)})"
                ) from self._safe_cause(exc)
        self._deliver = deliver
        if self._elector is not None:
            self._leading = asyncio.get_running_loop().create_task(
                self._elector.lead(self._poll_term), name="telegram-leader")
        elif self._poller is not None:
            self._poller.start()
        log.info("telegram: @%s is up (%s)", self.identity.username, self.options.mode)

    async def _set_menu(self) -> None:
        """The chat commands as the bot's menu (``setMyCommands``): every listed one in
        private chats, those for groups too everywhere else (``/forget`` is for direct
        messages only, so group menus leave it out). A failure costs the menu only, so it is
        logged, not fatal."""
        groups = [BotCommand(c.name, c.summary) for c in commands.listed(direct=False)]
        direct = [BotCommand(c.name, c.summary) for c in commands.listed(direct=True)]
        try:
            await self.api.request(lambda: self.bot.set_my_commands(groups))
            await self.api.request(lambda: self.bot.set_my_commands(
                direct, scope=BotCommandScopeAllPrivateChats()))
        except Exception as exc:
            log.warning("telegram: setMyCommands failed (%s); the menu stays as it was",
                        error_kind(exc))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._leading is not None:
                await stop(self._leading)
            elif self._poller is not None:
                await self._poller.stop()
            # Turns still answering need the bot; the router drains them after us.
            try:
                async with asyncio.timeout(self.options.close_grace):
                    await self._idle.wait()
            except TimeoutError:
                log.warning("telegram: %d replies still being sent after the %g s close "
                            "grace; closing without them", self._open_replies,
                            self.options.close_grace)
        finally:
            await self.bot.shutdown()

    async def _poll_term(self) -> None:
        """Poll while elected: a fresh poller each term, stopped when the term ends."""
        poller = self._poller = self._new_poller()
        poller.start()
        try:
            await asyncio.get_running_loop().create_future()  # until the term ends
        finally:
            await poller.stop()

    def health(self) -> Mapping[str, Any]:
        running = self._deliver is not None and not self._closed
        # Never a null reason while unhealthy (not started yet, or closed).
        reason = None if running else "not running"
        if self._elector is not None and not self._elector.is_leader:
            # Standing by is healthy: another worker polls.
            return {"ok": running, "mode": "polling", "leader": False, "last_poll_ok": None,
                    "conflicts": 0, "stalls": 0, "last_error": reason}
        if self._elector is not None and self._poller is not None:
            return {"mode": "polling", "leader": True, **self._poller.health()}
        if self._poller is not None:
            return {"mode": "polling", **self._poller.health()}
        return {"ok": running, "mode": "webhook", "last_poll_ok": None, "conflicts": 0,
                "stalls": 0, "last_error": reason}

    # -- input ----------------------------------------------------------------------------

    def _parse(self, data: dict[str, object]) -> Update:
        return Update.de_json(data, self.bot)

    async def handle(self, update: Update) -> None:
        """Convert and deliver one update (polling and webhook alike). Returns once it may be
        confirmed; raises ``RouterClosedError`` or ``UnavailableError`` when it must not be
        (it was not recorded: Telegram is to deliver it again)."""
        if self.identity is None or self._deliver is None:
            raise ChannelError("the telegram channel is not started")
        try:
            # PTB builds objects without checking field types: a forged update whose text is
            # an object reaches the pure conversion, which must not make it a 500 (a retry).
            result = to_inbound(update, bot=self.identity, group_mode=self.options.group_mode,
                                max_chars=self.options.max_message_chars,
                                received_at=time.time())
            if isinstance(result, Skip):
                probe = refusal_of(update, result.notice) if result.notice is not None else None
                if probe is None:
                    log.debug("telegram: update %d skipped (%s)", update.update_id,
                              result.reason)
                    return
                result = probe
            if update.message is not None and result.refusal is None:
                # Its files, as references (see the module docstring).
                result = with_files(update.message, result, self.options.max_attachment_bytes)
        except (TypeError, AttributeError, ValueError) as exc:
            self.metrics.channel_errors.labels(channel=self.name, kind=Failure.MALFORMED).inc()
            log.warning("telegram: update %d dropped: a field has the wrong type",
                        update.update_id)
            raise MalformedUpdateError(update.update_id) from exc
        if not _valid_ids(result):
            self.metrics.channel_errors.labels(channel=self.name, kind=Failure.BAD_ID).inc()
            log.warning("telegram: update %d dropped: its chat, topic or user id is not an "
                        "integer", update.update_id)
            return
        if result.refusal is not None:
            log.info("telegram: update %d is not for the agent; access control decides "
                     "who hears why", update.update_id)
            await self._deliver(result)
            return
        try:
            await self._deliver(result)
        except (RouterClosedError, UnavailableError):
            raise  # not recorded: left to Telegram (polling holds its offset, a webhook 503s)
        except Exception as exc:  # dropped (at most once), see the module docstring
            self.metrics.channel_errors.labels(channel=self.name, kind=Failure.DELIVER).inc()
            log.error("telegram: update %d could not be delivered (%s)",
                      update.update_id, self.api.describe(exc))

    async def fetch_file(self, attachment: Attachment) -> Attachment:
        """Download a file this channel handed in as a reference (see the module docstring);
        never raises for a failed download."""
        return await fetch(self.api, attachment, self.options.max_attachment_bytes)

    # -- ProactiveChannel: a bot may write only to chats that have talked to it ----------------

    starts_conversations = False

    async def direct_chat(self, person: str, tenant: str) -> str | None:
        """A private chat's id is the person's user id."""
        return person

    # -- output ---------------------------------------------------------------------------

    def reply_sink(self, inbound: Inbound) -> ReplySink:
        thread = inbound.key.thread
        reply_to = inbound.meta.get("message_id") if inbound.chat_type != "private" else None
        target = TelegramTarget(
            self.api, int(inbound.key.chat), thread_id=int(thread) if thread else None,
            reply_to=reply_to if isinstance(reply_to, int) else None,
            preview_after=self.edit_interval, on_begin=self._reply_begin,
            on_done=self._reply_done)
        return EditStreamer(target, min_interval=self.edit_interval,
                            typing_interval=self.options.typing_interval,
                            typing_delay=self.options.typing_delay)

    @property
    def pending_replies(self) -> int:
        """Final replies being delivered now (turns' answers, notices)."""
        return self._open_replies

    def _reply_begin(self) -> None:
        self._open_replies += 1
        self._idle.clear()

    def _reply_done(self) -> None:
        self._open_replies -= 1
        if self._open_replies <= 0:
            self._open_replies = 0
            self._idle.set()

    def _safe_cause(self, exc: BaseException) -> BaseException | None:
        # PTB puts the token into some exception texts (InvalidToken); such a cause is not
        # chained, so no traceback of ours can show it.
        return None if self.api.redact(str(exc)) != str(exc) else exc


_INTEGER = re.compile(r"-?[0-9]{1,20}")


def _valid_ids(inbound: Inbound) -> bool:
    """Telegram's chat, topic and user ids are integers; anything else never came from it."""
    ids = (inbound.key.chat, inbound.key.thread, inbound.sender.id)
    return all(i is None or _INTEGER.fullmatch(i) for i in ids)


def refusal_of(update: Update, notice: str) -> Inbound | None:
    """An inbound that carries only ``notice`` for the sender of ``update`` (see the module
    docstring); None when the update names no chat or sender."""
    message, user = update.message, update.effective_user
    if message is None or user is None:
        return None
    meta = {"username": user.username} if user.username else {}
    return Inbound(key=ConversationKey(CHANNEL, str(message.chat.id)),
                   sender=Sender(str(user.id), user.full_name or user.username or None),
                   text="", chat_type=message.chat.type, received_at=time.time(), meta=meta,
                   refusal=notice)
