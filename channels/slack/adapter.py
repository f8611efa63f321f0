"""The Slack channel: Events API over HTTP (``POST /slack/events``) or Socket Mode, replies by
chat.postMessage / chat.update in the person's thread.

Data path: the endpoint verifies the event (:mod:`channels.slack.events`; it hands a person's
message to us itself and the rest to bolt) or the socket does (:mod:`channels.slack.socket`,
through bolt), and our listener runs before Slack gets its answer:
:mod:`channels.slack.convert` turns the event into an :class:`~gateway.edge.messages.Inbound` and
``deliver`` (the access gate in front of the router) is awaited, which returns once the
message is durably recorded and its turn queued. Only then does Slack get its 200 (or its
Socket Mode ack), so an acknowledged message survives a crash; when it could not be recorded
(the store or Redis is down, the gateway is shutting down) Slack gets a 503 with
``Retry-After`` and ``{"error": <why>}`` (over Socket Mode: no ack) and retries.
The sender's display name and @username come from a cache that is warmed in the background
(users.info): a sender's first message after a start goes without them, unless access control
needs the @username (``SLACK_ALLOWED_USERS`` names someone by it): then a sender the cache
does not know yet is looked up first, waiting at most :data:`NAME_WAIT` seconds, so an allowed
person's first message is not taken for a stranger's. Ids (channel, thread, ts, user) are
checked as safe names before anything else; a signed event with a bad one is acknowledged and
dropped, never recorded or logged as given.

Redeliveries: Slack retries an event it thinks we missed (``X-Slack-Retry-Num``), resends
events after a Socket Mode reconnect, and sends two events (``app_mention`` and ``message``)
for one mention. All share the ``platform_id`` ``team:channel:ts``, which the router's one
duplicate check recognises (across restarts, and across workers): a twin that arrives while
the first is being recorded waits for it, so its 200 also means "recorded".

Files are not downloaded before the acknowledgement (a large one would hold it past Slack's 3
seconds, and Slack would retry the event): the message is owed with references to them
(:mod:`channels.slack.files`), and the core calls :meth:`SlackChannel.fetch_file` as the
message's turn starts, so the download is part of the turn, and a crash after the
acknowledgement leaves the references in the owed journal for the next start to fetch. A
download that fails then gets the person a reply saying the file could not be downloaded.

Several workers (``GATEWAY_REDIS_URL``): in Socket Mode only the elected leader holds the
socket; the others take over when its lease lapses. The Events API over HTTP is served by
every worker.

Shutdown: the gateway stops the router first (events then get a 503: Slack retries them
later, against the next gateway to start), lets in-flight turns reply through this channel,
and then calls :meth:`SlackChannel.aclose`, which closes the socket (the HTTP route answers
503), cancels name lookups and closes the client's HTTP session. A reply still being written
after that gets a one-off session per call from slack_sdk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, Literal

import aiohttp
from aiohttp import web
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.convert import (
    CHANNEL,
    META_REPLY_THREAD,
    META_TS,
    SLASH_COMMAND,
    Ignored,
    SlackFile,
    files_of,
    from_slash_command,
    to_inbound,
)
from channels.slack.events import EVENTS_PATH, EventsEndpoint, build_app
from channels.slack.files import fetch, with_files
from channels.slack.sink import SlackCalls, SlackTarget
from channels.slack.socket import SocketMode
from channels.streaming import TYPING_DELAY, EditStreamer
from gateway.edge import commands
from gateway.edge.channel import Deliver, ReplySink, RouterClosedError
from gateway.edge.coordination import LeaderElector
from gateway.edge.errors import RETRY_AFTER, ChannelError, ConfigError, Failure, UnavailableError
from gateway.edge.ids import InvalidIdError, valid_id
from gateway.edge.messages import Attachment, Inbound, Sender
from gateway.edge.metrics import Metrics
from gateway.edge.tasks import stop

log = logging.getLogger(__name__)

HISTORY_SCOPES: Final = frozenset({"channels:history", "groups:history", "im:history",
                                    "mpim:history"})
"""What reading its own threads takes (a taken-over answer finds its message there)."""
NAME_LOOKUP_TIMEOUT: Final = 2.0
NAME_WAIT: Final = 1.5
"""Seconds a first message waits for its sender's names when access control needs them (Slack
wants its answer within 3 s)."""
NAME_CACHE_SIZE: Final = 1024
NAME_TTL: Final = 3600.0
NAME_RETRY_AFTER: Final = 60.0
"""After a failed users.info, the sender goes nameless this long before the next try."""
REFUSED_TOKEN: Final = frozenset({"invalid_auth", "not_authed", "not_allowed_token_type",
                                  "account_inactive", "token_revoked", "token_expired"})
"""Slack's answers that mean the token itself is refused (not a passing failure)."""

Mode = Literal["http", "socket"]
_Names = tuple[str | None, str | None]


class SlackChannel:
    """See the module docstring. Build with :meth:`from_settings`."""

    name = CHANNEL

    def __init__(
        self,
        *,
        bot_token: str,
        signing_secret: str | None,
        app_token: str | None,
        metrics: Metrics,
        api_base_url: str | None = None,
        max_message_chars: int = 16_000,
        edit_interval: float = 1.0,
        typing_delay: float = TYPING_DELAY,
        elector: LeaderElector | None = None,
        max_attachment_bytes: int = 20 * 1024 * 1024,
        names_before_access: bool = False,
    ) -> None:
        self.mode: Mode = "socket" if app_token else "http"
        # Files are downloaded with the bot token, sent only where convert.token_allowed says.
        self._bot_token = bot_token
        self._api_base_url = api_base_url
        self.max_attachment_bytes = max_attachment_bytes
        self.names_before_access = names_before_access
        """Look a new sender's @username up before access control decides (see _with_names)."""
        if self.mode == "http" and not signing_secret:
            raise ConfigError("Slack over HTTP needs SLACK_SIGNING_SECRET "
                              "(or set SLACK_APP_TOKEN for Socket Mode)")
        self.metrics = metrics
        self.max_message_chars = max_message_chars
        self.edit_interval = edit_interval
        self.typing_delay = typing_delay
        client_args: dict[str, Any] = {"base_url": api_base_url} if api_base_url else {}
        self.client = AsyncWebClient(
            token=bot_token,
            retry_handlers=[AsyncConnectionErrorRetryHandler(),
                            AsyncRateLimitErrorRetryHandler(max_retry_count=2)],
            **client_args,
        )
        self.calls = SlackCalls(self.client, metrics)
        self.app = build_app(self.client, signing_secret=signing_secret,
                             on_event=self._on_event, on_command=self._on_command,
                             verify_requests=self.mode == "http")
        self._socket = SocketMode(self.app, app_token, self.client) if app_token else None
        self._app_token = app_token
        self._endpoint = (EventsEndpoint(self.app, signing_secret, metrics,
                                         on_event=self._on_event)
                          if signing_secret else None)
        # Several workers: only the elected one holds the socket (see the module docstring).
        self._elector = elector if app_token else None
        self._leading: asyncio.Task[None] | None = None
        # user id -> ((display name, username), monotonic expiry)
        self._names: OrderedDict[str, tuple[_Names, float]] = OrderedDict()
        self._deliver: Deliver | None = None
        self._group: asyncio.TaskGroup | None = None
        self._warming: dict[str, asyncio.Task[None]] = {}  # user id -> its users.info lookup
        self._events = 0
        self._auth_error: str | None = None
        self._closed = False

    # -- Channel -----------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        """``POST /slack/events`` in HTTP mode; nothing in Socket Mode."""
        if self.mode != "http":
            return []
        return [web.post(EVENTS_PATH, self._http_events)]

    async def start(self, deliver: Deliver) -> None:
        if self._closed:
            raise RuntimeError("the Slack channel is closed")
        self._deliver = deliver
        self.client.session = aiohttp.ClientSession()
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        await self._check_auth()
        await self._check_app_token()
        if self._elector is not None:
            self._leading = self._group.create_task(self._elector.lead(self._socket_term))
        elif self._socket is not None:
            await self._socket.start(self._group)
        log.info("slack channel started (%s mode)", self.mode)

    def reply_sink(self, inbound: Inbound) -> ReplySink:
        return EditStreamer(SlackTarget(self.calls, inbound), min_interval=self.edit_interval,
                            preview_after=self.edit_interval, typing_delay=self.typing_delay)

    async def _socket_term(self) -> None:
        """Hold the socket while elected; it is closed when the term ends."""
        assert self._socket is not None, "only elected in Socket Mode"
        assert self._group is not None, "started in start()"
        await self._socket.start(self._group)
        try:
            await asyncio.get_running_loop().create_future()  # until the term ends
        finally:
            await self._socket.aclose()

    def health(self) -> Mapping[str, Any]:
        running = self._group is not None and not self._closed
        standby = self._elector is not None and not self._elector.is_leader
        connected = (self._socket.connected if self._socket is not None and not standby
                     else True)
        extra = {} if self._elector is None else {"leader": not standby}
        ok = running and connected and self._auth_error is None
        # Never a null reason while unhealthy: what failed last, else what is not so.
        reason = (self._auth_error or self.calls.last_error
                  or (None if ok else "not running" if not running
                      else "socket mode: not connected"))
        return {"ok": ok, "mode": self.mode, "events": self._events, "last_error": reason,
                **extra}

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._leading is not None:  # its term closes the socket as it ends
                await stop(self._leading)
            if self._socket is not None:
                await self._socket.aclose()
        finally:
            try:
                await self._stop_tasks()
            finally:
                session, self.client.session = self.client.session, None
                if session is not None:
                    await session.close()

    # -- input -------------------------------------------------------------------------------

    async def _http_events(self, request: web.Request) -> web.Response:
        if self._closed:
            # Not acknowledged, so Slack retries (and reaches the next gateway to start).
            return web.json_response({"error": "shutting down"}, status=503,
                                     headers={"Retry-After": str(RETRY_AFTER)})
        assert self._endpoint is not None, "HTTP mode always has a signing secret"
        return await self._endpoint.handle(request)

    async def _on_event(self, body: Mapping[str, Any], bot_user_id: str | None) -> str | None:
        """Run before Slack gets its answer (by bolt's listener, or by the HTTP endpoint for a
        person's message): convert and deliver (record and queue). ``None``: taken; otherwise
        why not (Slack gets a 503 and retries)."""
        self._events += 1
        if bot_user_id is not None:
            self._auth_error = None  # an auth.test (ours at start, or bolt's) succeeded
        if self._closed or self._deliver is None:
            log.info("slack event not taken: the channel is not running")
            return "not running"
        result = to_inbound(body, bot_user_id=bot_user_id, max_chars=self.max_message_chars,
                            received_at=time.time())
        if isinstance(result, Ignored):
            log.debug("slack event ignored: %s", result.reason)
            return None
        files = files_of(body.get("event") or {}, max_bytes=self.max_attachment_bytes,
                         api_base_url=self._api_base_url)
        try:
            await self._accept(result, self._deliver, files)
        except RouterClosedError:
            log.info("slack event not taken: the gateway is shutting down")
            return "shutting down"
        except UnavailableError as exc:  # logged once per episode by the router
            self.metrics.channel_errors.labels(channel=CHANNEL, kind=Failure.UNAVAILABLE).inc()
            return exc.public
        except Exception:
            log.exception("slack: handing a message to the router failed; Slack will retry")
            self.metrics.channel_errors.labels(channel=CHANNEL, kind=Failure.DELIVER).inc()
            return "not taken; retry later"
        return None

    async def _on_command(self, body: Mapping[str, Any]) -> str | None:
        """``/gateway WORD``: help and unknown words are answered at once (to the person
        only); ``new`` in a DM goes to the router like ``/new`` elsewhere, in the background
        (it may wait for a running turn), and the router's answer arrives as a message."""
        prefix = f"{SLASH_COMMAND} "
        command = from_slash_command(body, received_at=time.time())
        chosen = commands.parse(f"/{command.word}")
        if chosen is None:
            return f"Unknown command {command.word!r}.\n{commands.help_text(prefix=prefix)}"
        reply = commands.answer(chosen, prefix=prefix)
        if reply is not None:
            return reply
        if command.inbound is None:
            return ("Here every thread is its own conversation: start a new thread to start "
                    f"over. In a direct message with me, {prefix}{chosen.name} starts afresh.")
        if self._closed or self._deliver is None or self._group is None:
            return "I am restarting; try again in a moment."
        self._group.create_task(self._deliver_command(command.inbound, self._deliver))
        return None

    async def _deliver_command(self, inbound: Inbound, deliver: Deliver) -> None:
        try:
            await self._accept(inbound, deliver)
        except (RouterClosedError, UnavailableError):
            log.info("slack command not taken (the gateway is stopping or cannot record)")
        except Exception:
            log.exception("slack: handing a command to the router failed")
            self.metrics.channel_errors.labels(channel=CHANNEL, kind=Failure.DELIVER).inc()

    async def _accept(self, inbound: Inbound, deliver: Deliver,
                      files: list[SlackFile | Attachment] | None = None) -> None:
        """Deliver a message (names and files added); raises when it was not recorded."""
        if not _valid_ids(inbound):
            # Signed, so acknowledged (a retry would be as bad), but never recorded or logged
            # as given: an id with a newline would split a log line.
            self.metrics.channel_errors.labels(channel=CHANNEL, kind=Failure.BAD_ID).inc()
            log.warning("slack: event dropped: its channel, thread, ts or user id is not a "
                        "valid id")
            return
        named = await self._with_names(inbound)
        await deliver(with_files(named, files or []))

    # -- ProactiveChannel: a bot may write to anyone in its workspace --------------------------

    starts_conversations = True

    async def direct_chat(self, person: str, tenant: str) -> str | None:
        """The DM channel with ``person`` (``conversations.open``); None when Slack refuses
        (logged and counted by the call)."""
        try:
            valid_id(person, "user id")
        except InvalidIdError:
            return None
        response = await self.calls.attempt("conversations.open",
                                            self.client.conversations_open(users=person))
        channel = response.get("channel") if response is not None else None
        found = channel.get("id") if isinstance(channel, dict) else None
        try:
            return valid_id(found, "channel id")
        except InvalidIdError:
            return None

    async def fetch_file(self, attachment: Attachment) -> Attachment:
        """Download a file this channel handed in as a reference (see the module docstring);
        never raises for a failed download."""
        session = self.client.session
        if session is not None and not session.closed:
            return await fetch(session, self._bot_token, attachment,
                               max_bytes=self.max_attachment_bytes,
                               api_base_url=self._api_base_url)
        # Closed already (a turn finishing during the stop): a session of its own.
        async with aiohttp.ClientSession() as own:
            return await fetch(own, self._bot_token, attachment,
                               max_bytes=self.max_attachment_bytes,
                               api_base_url=self._api_base_url)

    async def _stop_tasks(self) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        for task in self._warming.values():
            task.cancel()
        await group.__aexit__(None, None, None)

    # -- Web API -----------------------------------------------------------------------------

    async def _check_auth(self) -> None:
        """auth.test once at start, so a bad token shows in the log and on /healthz at once."""
        response = await self.calls.attempt("auth.test", self.client.auth_test(), quiet=True)
        if response is None:
            # Nothing would work: fail the start with one line rather than run deaf.
            raise ChannelError(f"slack: auth.test failed ({self.calls.last_error or 'no answer'})"
                               "; check SLACK_BOT_TOKEN and SLACK_API_BASE_URL")
        log.info("slack: connected to team %s as %s", response.get("team_id"),
                 response.get("user_id"))
        user_id = response.get("user_id")
        if self._endpoint is not None and isinstance(user_id, str) and user_id:
            self._endpoint.bot_user_id = user_id  # people's messages now skip bolt's dispatch
        scopes = {s.strip() for s in str(response.headers.get("x-oauth-scopes", "")).split(",")
                  if s.strip()}
        if scopes and not scopes >= HISTORY_SCOPES:
            # An answer posted just before a kill, its ts not yet noted, could not be found
            # in the thread again (channels.slack.sink): answers open as placeholders.
            self.calls.history = False
            log.warning("slack: the app cannot read its threads (add the %s scopes): answers "
                        "open as placeholders instead", ", ".join(sorted(HISTORY_SCOPES - scopes)))

    async def _check_app_token(self) -> None:
        """``apps.connections.open`` once at start in Socket Mode: a SLACK_APP_TOKEN that Slack
        refuses stops the start with one line (the socket client would retry it forever, a
        traceback every 10 s, the gateway deaf meanwhile). Any other failure is left to the
        socket's own retries."""
        if self._app_token is None:
            return
        opened = await self.calls.attempt(
            "apps.connections.open", self.client.apps_connections_open(app_token=self._app_token),
            quiet=True)
        if opened is not None:
            return  # the URL is single-use and left unused: the socket asks for its own
        error = self.calls.last_error or "no answer"
        if error.removeprefix("apps.connections.open: ") in REFUSED_TOKEN:
            raise ChannelError(f"slack: SLACK_APP_TOKEN was refused ({error}); it must be the "
                               "app-level token (xapp-...) with connections:write")
        log.warning("slack: could not check SLACK_APP_TOKEN (%s); Socket Mode keeps trying",
                    error)

    async def _with_names(self, inbound: Inbound) -> Inbound:
        """Add the sender's display name and @username if they are cached; a missing or
        expired entry is looked up in the background, for the sender's next message.

        With ``names_before_access`` (an allowlist names people by @username) a sender with
        no entry at all is looked up first, waiting at most :data:`NAME_WAIT` seconds: access
        control must see the @username of an allowed person's first message, or it would take
        them for a stranger."""
        user = inbound.sender.id
        cached = self._names.get(user)
        if cached is None or cached[1] <= time.monotonic():
            self._warm(user)
        lookup = self._warming.get(user)
        if cached is None and self.names_before_access and lookup is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(NAME_WAIT):
                    await asyncio.shield(lookup)  # it goes on for the next message if slow
            cached = self._names.get(user)
        if cached is None:
            return inbound
        display, username = cached[0]  # an expired entry still serves until it is renewed
        if display is None and username is None:
            return inbound
        meta = dict(inbound.meta)
        if username is not None:
            meta["username"] = username
        return dataclasses.replace(inbound, sender=Sender(user, display or username), meta=meta)

    def names_cached(self, user: str) -> bool:
        """Whether a lookup of ``user``'s names has ended (a next message carries them)."""
        return user in self._names

    def _warm(self, user: str) -> None:
        if user not in self._warming and self._group is not None and not self._closed:
            self._warming[user] = self._group.create_task(self._look_up(user))

    async def _look_up(self, user: str) -> None:
        """users.info for ``user`` into the name cache (best effort; never raises)."""
        try:
            names: _Names = (None, None)
            ttl = NAME_RETRY_AFTER
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(NAME_LOOKUP_TIMEOUT):
                    response = await self.calls.attempt("users.info",
                                                        self.client.users_info(user=user))
                    if response is not None:
                        names, ttl = _names_of(response.get("user")), NAME_TTL
            self._names[user] = (names, time.monotonic() + ttl)
            self._names.move_to_end(user)
            if len(self._names) > NAME_CACHE_SIZE:
                self._names.popitem(last=False)
        except Exception:  # a failing lookup must not take the channel's task group down
            log.exception("slack: looking up a user's names failed")
        finally:
            self._warming.pop(user, None)


def _names_of(user: object) -> _Names:
    if not isinstance(user, Mapping):
        return None, None
    profile = user.get("profile")
    profile = profile if isinstance(profile, Mapping) else {}
    display = profile.get("display_name") or profile.get("real_name") or user.get("real_name")
    username = user.get("name")
    return (display if isinstance(display, str) and display else None,
            username if isinstance(username, str) and username else None)


def _valid_ids(inbound: Inbound) -> bool:
    """Every platform id that reaches a conversation key, a reply or a log line is a safe name
    (Slack's ids always are: ``C0123ABC``, ``U0123ABC``, ``1700000000.000100``)."""
    ids = (inbound.key.chat, inbound.key.thread, inbound.sender.id,
           inbound.meta.get(META_TS), inbound.meta.get(META_REPLY_THREAD))
    for value in ids:
        if value is None:
            continue
        try:
            valid_id(value, "slack id")
        except InvalidIdError:
            return False
    return True
