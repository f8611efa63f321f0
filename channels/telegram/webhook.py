"""``POST /telegram/webhook`` on the gateway's own HTTP server (``TELEGRAM_MODE=webhook``).

Answers, in the order they are checked: 503 while the channel is not running (Telegram
retries later), 403 when ``X-Telegram-Bot-Api-Secret-Token`` is missing or wrong (compared
with :func:`hmac.compare_digest`; counted, logged once per episode, before the body is read),
413 for a body over :data:`MAX_BODY` bytes, 408 for one not sent within the server's body time
limit (``GATEWAY_HTTP_TIMEOUT``), 400 for a body
that is not a JSON Update, otherwise 200 as soon as the update is recorded: ``handle`` returns
once ``deliver`` has durably recorded the message, and the turn runs afterwards in the router,
so a slow model never holds the HTTP answer. Nothing is recorded for a refused request. When
the update could not be recorded (the store or Redis is down: ``{"error": "store
unavailable"}``, or the gateway is stopping) the answer is 503 with ``Retry-After``, and
Telegram delivers it again; the router logs that once per failure episode. An internal failure
before the update was recorded answers 500 so that Telegram retries.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Final

import orjson
from aiohttp import web
from telegram import Update

from gateway.edge.channel import RouterClosedError
from gateway.edge.errors import RETRY_AFTER, ChannelError, Failure, UnavailableError
from gateway.edge.http_limits import BodyRefused, read_body
from gateway.edge.metrics import Metrics
from gateway.edge.refusals import RefusalLog

log = logging.getLogger(__name__)

PATH: Final = "/telegram/webhook"
SECRET_HEADER: Final = "X-Telegram-Bot-Api-Secret-Token"
MAX_BODY: Final = 256 * 1024
"""Updates are a few KiB (a message is at most 4096 characters plus entities)."""

Parse = Callable[[dict[str, object]], Update]
Handle = Callable[[Update], Awaitable[None]]


class WebhookEndpoint:
    """The webhook route; ``ready`` says whether the channel is running."""

    def __init__(self, secret: str, *, parse: Parse, handle: Handle,
                 ready: Callable[[], bool], metrics: Metrics) -> None:
        self._secret = secret.encode()
        self.parse = parse
        self.handle = handle
        self.ready = ready
        self.metrics = metrics
        self.refusals = RefusalLog(metrics, log, "telegram webhook")

    def route(self) -> web.RouteDef:
        return web.post(PATH, self.receive)

    async def receive(self, request: web.Request) -> web.Response:
        if not self.ready():
            return _error(503, "not running", retry=True)
        given = request.headers.get(SECRET_HEADER, "").encode()
        if not hmac.compare_digest(given, self._secret):
            self.metrics.channel_errors.labels(channel="telegram",
                                               kind=Failure.WEBHOOK_SECRET).inc()
            self.refusals.refused("wrong-secret")
            return _error(403, "forbidden")
        try:
            body = await read_body(request, MAX_BODY)
        except BodyRefused as exc:
            self.refusals.refused("too-large" if exc.status == 413 else "slow-body")
            return _error(exc.status, "body too large" if exc.status == 413 else str(exc))
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _error(400, "body is not JSON")
        if not isinstance(data, dict) or type(data.get("update_id")) is not int:
            return _error(400, "body is not a Telegram Update")
        try:
            update = self.parse(data)
        except Exception:  # PTB raises KeyError/TypeError/... for malformed objects
            return _error(400, "body is not a Telegram Update")
        try:
            await self.handle(update)
        except MalformedUpdateError:
            return _error(400, "body is not a Telegram Update")
        except UnavailableError as exc:  # not recorded: Telegram delivers it again
            self.metrics.channel_errors.labels(channel="telegram", kind=Failure.UNAVAILABLE).inc()
            return _error(503, exc.public, retry=True)
        except RouterClosedError:
            return _error(503, "shutting down", retry=True)
        except Exception as exc:  # not recorded: a 500 makes Telegram deliver it again
            self.metrics.channel_errors.labels(channel="telegram", kind=Failure.DELIVER).inc()
            log.error("telegram webhook: update %d failed (%s)", update.update_id,
                      type(exc).__name__)
            return _error(500, "internal error")
        return web.Response(status=200)


class MalformedUpdateError(ChannelError):
    """An update PTB parsed whose fields are not of their types (a ``text`` that is an
    object): refused (400), never retried; polling confirms and skips it."""

    def __init__(self, update_id: int) -> None:
        super().__init__(f"update {update_id} has a field of the wrong type")


def _error(status: int, message: str, *, retry: bool = False) -> web.Response:
    headers = {"Retry-After": str(RETRY_AFTER)} if retry else None
    return web.json_response({"error": message}, status=status, headers=headers)
