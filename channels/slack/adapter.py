"""The Slack channel: Events API over HTTP (``POST /slack/events``) or Socket Mode, replies by
chat.postMessage / chat.update in the person's thread.

Data path: bolt verifies and acknowledges the event (:mod:`channels.slack.events`, or the
socket in :mod:`channels.slack.socket`), :mod:`channels.slack.convert` turns it into an
:class:`~gateway.messages.Inbound` and it is queued; the answer to Slack goes out at once. A
worker task then drops redeliveries, adds the sender's names and awaits ``deliver`` (the
access gate in front of the router), one event at a time, so messages keep their order.

Redeliveries: Slack retries an event it thinks we missed (``X-Slack-Retry-Num``), resends
events after a Socket Mode reconnect, and sends two events (``app_mention`` and ``message``)
for one mention. All share the ``platform_id`` ``team:channel:ts``, which is checked against a
file under ``<data_dir>/state/slack-events.jsonl`` kept for :data:`DEDUP_TTL`, so a restarted
gateway does not answer again (the router's own check is in memory only).

Several workers (``GATEWAY_REDIS_URL``): the redelivery check is the coordinator's shared
dedup (so the mention twin and Slack's retries are dropped whichever worker they reach), and
in Socket Mode only the elected leader holds the socket; the others take over when its lease
lapses. The Events API over HTTP is served by every worker.

Shutdown: :meth:`SlackChannel.aclose` stops input (the socket is closed; the HTTP route
answers 503, so Slack retries later rather than losing the event), lets the worker hand over
what was already acknowledged, then closes the client's HTTP session. Turns still finishing
afterwards (the gateway drains the router after closing channels) can still reply: slack_sdk
opens a one-off session per call when it has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import aiohttp
from aiohttp import web
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import Deliver, ReplySink
from channels.slack.convert import CHANNEL, Ignored, to_inbound
from channels.slack.events import EVENTS_PATH, EventsEndpoint, build_app
from channels.slack.sink import SlackCalls, SlackTarget
from channels.slack.socket import SocketMode
from channels.streaming import EditStreamer
from gateway.config import Settings
from gateway.coordination.base import Coordinator, LeaderElector
from gateway.dedup import Deduplicator
from gateway.dedup_file import FileDeduplicator
from gateway.errors import ConfigError
from gateway.messages import Inbound, Sender
from gateway.metrics import Metrics
from gateway.router import RouterClosedError

log = logging.getLogger("channels.slack")

DEDUP_TTL: Final = 6 * 3600.0
"""Seconds an event key is remembered: Slack's retries end within the hour; reconnects can
resend a little later, and the file stays small either way."""
DRAIN_GRACE: Final = 5.0
"""Seconds :meth:`SlackChannel.aclose` gives the worker to hand over acknowledged events."""
NAME_LOOKUP_TIMEOUT: Final = 2.0
NAME_CACHE_SIZE: Final = 1024
NAME_TTL: Final = 3600.0
NAME_RETRY_AFTER: Final = 60.0
"""After a failed users.info, the sender goes nameless this long before the next try."""

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
        data_dir: Path,
        metrics: Metrics,
        api_base_url: str | None = None,
        max_message_chars: int = 16_000,
        edit_interval: float = 1.0,
        dedup: Deduplicator | None = None,
        elector: LeaderElector | None = None,
    ) -> None:
        self.mode: Mode = "socket" if app_token else "http"
        if self.mode == "http" and not signing_secret:
            raise ConfigError("Slack over HTTP needs SLACK_SIGNING_SECRET "
                              "(or set SLACK_APP_TOKEN for Socket Mode)")
        self.metrics = metrics
        self.max_message_chars = max_message_chars
        self.edit_interval = edit_interval
        client_args: dict[str, Any] = {"base_url": api_base_url} if api_base_url else {}
        self.client = AsyncWebClient(
            token=bot_token,
            retry_handlers=[AsyncConnectionErrorRetryHandler(),
                            AsyncRateLimitErrorRetryHandler(max_retry_count=2)],
            **client_args,
        )
        self.calls = SlackCalls(self.client, metrics)
        self.app = build_app(self.client, signing_secret=signing_secret,
                             on_event=self._on_event, verify_requests=self.mode == "http")
        self._socket = SocketMode(self.app, app_token, self.client) if app_token else None
        self._endpoint = EventsEndpoint(self.app, signing_secret) if signing_secret else None
        self._dedup: Deduplicator = dedup or FileDeduplicator(
            data_dir / "state" / "slack-events.jsonl", ttl=DEDUP_TTL)
        # Several workers: only the elected one holds the socket (see the module docstring).
        self._elector = elector if app_token else None
        self._leading: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[Inbound | None] = asyncio.Queue()
        # user id -> ((display name, username), monotonic expiry)
        self._names: OrderedDict[str, tuple[_Names, float]] = OrderedDict()
        self._deliver: Deliver | None = None
        self._group: asyncio.TaskGroup | None = None
        self._worker: asyncio.Task[None] | None = None
        self._events = 0
        self._auth_error: str | None = None
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics, *,
                      edit_interval: float = 1.0,
                      coordinator: Coordinator | None = None) -> SlackChannel:
        if settings.slack_bot_token is None:
            raise ConfigError("GATEWAY_CHANNELS includes slack but SLACK_BOT_TOKEN is not set")

        def secret(value: Any) -> str | None:
            return value.get_secret_value() if value is not None else None

        app_token = secret(settings.slack_app_token)
        elector = None
        if coordinator is not None and app_token:
            # One election per app (a hash of its token names it, never the token itself).
            app_hash = hashlib.sha256(app_token.encode()).hexdigest()[:16]
            elector = coordinator.elector(f"slack-socket:{app_hash}")
        return cls(
            bot_token=settings.slack_bot_token.get_secret_value(),
            signing_secret=secret(settings.slack_signing_secret),
            app_token=app_token,
            api_base_url=settings.slack_api_base_url,
            data_dir=settings.data_dir,
            metrics=metrics,
            max_message_chars=settings.max_message_chars,
            edit_interval=edit_interval,
            dedup=coordinator.deduplicator("slack", DEDUP_TTL) if coordinator else None,
            elector=elector,
        )

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
        # Load the seen keys (a file read, a compacting rewrite and an fsync) off the loop now,
        # rather than inline on the first event; the worker that uses them starts after this.
        if isinstance(self._dedup, FileDeduplicator):
            await asyncio.to_thread(self._dedup._open)
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        self._worker = self._group.create_task(self._work())
        await self._check_auth()
        if self._elector is not None:
            self._leading = self._group.create_task(self._elector.lead(self._socket_term))
        elif self._socket is not None:
            await self._socket.start(self._group)
        log.info("slack channel started (%s mode)", self.mode)

    def reply_sink(self, inbound: Inbound) -> ReplySink:
        return EditStreamer(SlackTarget(self.calls, inbound), min_interval=self.edit_interval)

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
        return {
            "ok": running and connected and self._auth_error is None,
            "mode": self.mode,
            "events": self._events,
            "last_error": self._auth_error or self.calls.last_error,
            **extra,
        }

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._leading is not None:  # its term closes the socket as it ends
                self._leading.cancel()
                await asyncio.wait([self._leading])
            if self._socket is not None:
                await self._socket.aclose()
        finally:
            try:
                await self._stop_worker()
            finally:
                if isinstance(self._dedup, FileDeduplicator):
                    self._dedup.close()
                session, self.client.session = self.client.session, None
                if session is not None:
                    await session.close()

    # -- input -------------------------------------------------------------------------------

    async def _http_events(self, request: web.Request) -> web.Response:
        if self._closed:
            # Not acknowledged, so Slack retries (and reaches the next gateway to start).
            return web.json_response({"error": "shutting down"}, status=503)
        assert self._endpoint is not None, "HTTP mode always has a signing secret"
        return await self._endpoint.handle(request)

    def _on_event(self, body: Mapping[str, Any], bot_user_id: str | None) -> None:
        """bolt's listener: convert and queue. Runs before Slack gets its answer: no I/O."""
        self._events += 1
        if bot_user_id is not None:
            self._auth_error = None  # bolt's auth.test succeeded since start
        if self._closed:
            log.info("slack event dropped: the channel is closing")
            return
        result = to_inbound(body, bot_user_id=bot_user_id, max_chars=self.max_message_chars,
                            received_at=time.time())
        if isinstance(result, Ignored):
            log.debug("slack event ignored: %s", result.reason)
            return
        self._inbox.put_nowait(result)

    async def _work(self) -> None:
        while (inbound := await self._inbox.get()) is not None:
            try:
                await self._accept(inbound)
            except RouterClosedError:
                log.info("slack message dropped: the gateway is shutting down")
            except Exception:
                log.exception("slack: handing a message to the router failed")
                self.metrics.channel_errors.labels(channel=CHANNEL, kind="deliver").inc()

    async def _accept(self, inbound: Inbound) -> None:
        assert inbound.platform_id is not None, "convert always sets it"
        assert self._deliver is not None, "the worker starts in start()"
        if not await self._dedup.first_time(inbound.platform_id):
            self.metrics.duplicates.labels(channel=CHANNEL).inc()
            log.debug("slack event %s dropped as a redelivery", inbound.platform_id)
            return
        await self._deliver(await self._with_names(inbound))

    async def _stop_worker(self) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        worker = self._worker
        self._inbox.put_nowait(None)
        if worker is not None:
            await asyncio.wait([worker], timeout=DRAIN_GRACE)
            if not worker.done():
                log.warning("slack: %d acknowledged message(s) dropped at shutdown",
                            self._inbox.qsize())
            worker.cancel()
        await group.__aexit__(None, None, None)

    # -- Web API -----------------------------------------------------------------------------

    async def _check_auth(self) -> None:
        """auth.test once at start, so a bad token shows in the log and on /healthz at once."""
        response = await self.calls.attempt("auth.test", self.client.auth_test())
        if response is None:
            self._auth_error = f"auth.test: {self.calls.last_error or 'failed'}"
            return
        log.info("slack: connected to team %s as %s", response.get("team_id"),
                 response.get("user_id"))

    async def _with_names(self, inbound: Inbound) -> Inbound:
        """Add the sender's display name and @username (cached users.info; best effort)."""
        user = inbound.sender.id
        now = time.monotonic()
        cached = self._names.get(user)
        if cached is not None and cached[1] > now:
            names = cached[0]
        else:
            names, ttl = (None, None), NAME_RETRY_AFTER
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(NAME_LOOKUP_TIMEOUT):
                    response = await self.calls.attempt("users.info",
                                                        self.client.users_info(user=user))
                    if response is not None:
                        names, ttl = _names_of(response.get("user")), NAME_TTL
            self._names[user] = (names, now + ttl)
            self._names.move_to_end(user)
            if len(self._names) > NAME_CACHE_SIZE:
                self._names.popitem(last=False)
        display, username = names
        if display is None and username is None:
            return inbound
        meta = dict(inbound.meta)
        if username is not None:
            meta["username"] = username
        return dataclasses.replace(inbound, sender=Sender(user, display or username), meta=meta)


def _names_of(user: object) -> _Names:
    if not isinstance(user, Mapping):
        return None, None
    profile = user.get("profile")
    profile = profile if isinstance(profile, Mapping) else {}
    display = profile.get("display_name") or profile.get("real_name") or user.get("real_name")
    username = user.get("name")
    return (display if isinstance(display, str) and display else None,
            username if isinstance(username, str) and username else None)
