"""The Slack Events API front: a bolt ``AsyncApp`` and the aiohttp bridge to it.

bolt does what Slack requires of an endpoint: the ``v0`` signature and the 5-minute timestamp
window, the ``url_verification`` handshake, ``auth.test`` on first use, and dropping our own
bot's events. We add the listeners: ``message`` and ``app_mention`` go to ``on_event`` and
every other event type is acknowledged with an empty 200, so Slack never sees a 404 for an
event it was told to send.

Over HTTP, a person's message (an ``event_callback`` whose event is a ``message`` or an
``app_mention``, nearly every request Slack sends us) goes from the bridge to ``on_event``
without bolt, once the channel's own ``auth.test`` has told us our bot user id: bolt's
dispatch (its middleware chain, listener matching, the keyword arguments it builds by
inspecting signatures, and a second HMAC) cost about an eighth of the gateway's CPU per
message, and what it would do for such an event, the bridge has done already (signature,
timestamp, envelope shape) or :func:`channels.slack.convert.to_inbound` does anyway (our own
bot's and every bot's messages are dropped there). Anything else, and any body orjson does not
take as a JSON object, goes to bolt as before.

The bridge checks the signature itself (slack_sdk's ``SignatureVerifier``, the one bolt uses)
before bolt sees the request, because bolt parses the body first and some unsigned junk
(a JSON array, a broken ``payload=`` form) makes that parse raise: a forged or stale request is
a 401, a signed body bolt cannot parse a 400, never a 500. bolt then verifies again. What it
checks before reading the body, and the body's limits, are on :class:`EventsEndpoint`.

The app runs with ``process_before_response=True``: bolt answers once the listener has
returned, and ours awaits ``on_event``, which records the message (the answer waits on that
session write, or for a message with files on its owed journal line, never on a turn or a
download), so Slack's 200 (or the Socket Mode ack) means "recorded".
When ``on_event`` could not take the event (the gateway is shutting down, the store or Redis
is down) the answer is a 503 with ``Retry-After`` and ``{"error": <why>}``, which Slack retries
(over Socket Mode: no ack, so Slack resends).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import orjson
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.convert import PERSON_EVENTS, SLASH_COMMAND
from gateway.edge.errors import RETRY_AFTER
from gateway.edge.http_limits import BodyRefused, read_body
from gateway.edge.metrics import Metrics
from gateway.edge.refusals import RefusalLog

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
MAX_BODY: Final = 512 * 1024
"""Slack messages hold at most 40,000 characters; with the rich-text copy in ``blocks`` and the
envelope, a real event stays well under this."""
TIMESTAMP_WINDOW: Final = 300
"""Seconds a request's timestamp may be off (Slack's own rule, which bolt applies again)."""
_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")

OnCommand = Callable[[Mapping[str, Any]], Awaitable[str | None]]
"""Called with a ``/gateway`` slash-command payload; returns the text to answer the person
with at once (shown to them only), or None for an empty acknowledgement (the answer comes as
a message). Must be quick: Slack wants the acknowledgement within 3 seconds."""

OnEvent = Callable[[Mapping[str, Any], str | None], Awaitable[str | None]]
"""Called with the envelope and our bot user id (from bolt's ``auth.test``) before Slack gets
its answer; ``None`` when the event was taken (recorded, or ignored on purpose), otherwise the
reason for a 503 (with ``Retry-After``). Must be quick: Slack retries an event not answered
within 3 seconds."""



class _ClientTokenNotice(logging.Filter):
    """Drops bolt's warning that the client's token wins over ``SLACK_BOT_TOKEN``: bolt reads
    that variable by itself when it is exported, and the client's token winning is the point."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`token` will be unused" not in record.getMessage()


def build_app(client: AsyncWebClient, *, signing_secret: str | None, on_event: OnEvent,
              on_command: OnCommand | None = None, verify_requests: bool = True) -> AsyncApp:
    """A bolt app over ``client`` (which carries the bot token and the API base URL).

    ``verify_requests`` is False only for Socket Mode, where nothing comes in over HTTP (bolt
    skips verification for socket requests anyway).
    """
    bolt_log = log.getChild("bolt")  # the SDK's records, under this module's name
    if not any(isinstance(f, _ClientTokenNotice) for f in bolt_log.filters):
        bolt_log.addFilter(_ClientTokenNotice())
    app = AsyncApp(
        # The client carries the token; passing token= as well only makes bolt log a warning.
        client=client,
        signing_secret=signing_secret or "",
        process_before_response=True,
        request_verification_enabled=verify_requests,
        logger=bolt_log,
        name="gateway",
    )

    async def person_event(body: dict[str, Any],
                           context: AsyncBoltContext) -> BoltResponse | None:
        refused = await on_event(body, context.bot_user_id)
        if refused is None:
            return None  # bolt acknowledges: an empty 200
        return BoltResponse(status=503, body={"error": refused},
                            headers={"Retry-After": str(RETRY_AFTER)})

    async def other_event() -> None:
        return None

    async def slash_command(ack: AsyncAck, body: dict[str, Any]) -> None:
        assert on_command is not None
        text = await on_command(body)
        await (ack(text=text) if text is not None else ack())

    if on_command is not None:
        app.command(SLASH_COMMAND)(slash_command)
    for kind in sorted(PERSON_EVENTS):
        app.event(kind)(person_event)
    # Registered last: bolt runs the first matching listener only.
    app.event(re.compile(".*"))(other_event)
    return app


class EventsEndpoint:
    """``POST /slack/events``: cheap checks, verify, hand to bolt, translate bolt's answer.

    Before a byte of the body is read: the timestamp must be a number within Slack's 5-minute
    window and the signature must look like one (``v0=`` and 64 hex digits), else 401; a
    ``Content-Length`` over :data:`MAX_BODY` is a 413. The body is then read up to that cap and
    within the server's body time limit (413/408), and only then is the HMAC checked. So a
    client without the signing secret can make us buffer at most :data:`MAX_BODY` bytes per
    request, and only with a fresh timestamp. Refusals are counted and logged once per episode
    (:class:`gateway.edge.refusals.RefusalLog`), never one line per request.
    """

    def __init__(self, app: AsyncApp, signing_secret: str, metrics: Metrics,
                 clock: Callable[[], float] = time.time, *,
                 on_event: OnEvent | None = None) -> None:
        self.app = app
        self.verifier = SignatureVerifier(signing_secret)
        self.refusals = RefusalLog(metrics, log, "slack events")
        self.clock = clock
        self.on_event = on_event
        self.bot_user_id: str | None = None
        """Our bot user id, set by the channel once its ``auth.test`` answered: from then on
        a person's message goes straight to ``on_event`` (see the module docstring)."""

    async def handle(self, request: web.Request) -> web.Response:
        early = self._unsigned(request.headers)
        if early is not None:
            self.refusals.refused(early)
            return web.json_response({"error": "invalid request"}, status=401)
        try:
            raw = await read_body(request, MAX_BODY)
        except BodyRefused as exc:
            self.refusals.refused("too-large" if exc.status == 413 else "slow-body")
            return web.json_response({"error": str(exc)}, status=exc.status)
        if not self._signed(raw, request):
            self.refusals.refused("bad-signature")
            return web.json_response({"error": "invalid request"}, status=401)
        direct = self._person_event(raw)
        if direct is not None:
            if not _bolt_can_route(direct):
                self.refusals.refused("malformed-envelope")
                return web.json_response({"error": "bad request"}, status=400)
            assert self.on_event is not None, "only set with on_event"
            refused = await self.on_event(direct, self.bot_user_id)
            if refused is None:
                return web.Response(status=200)  # what bolt answers: an empty 200
            return web.json_response({"error": refused}, status=503,
                                     headers={"Retry-After": str(RETRY_AFTER)})
        try:
            bolt_request = AsyncBoltRequest(
                # Slack's bodies are UTF-8, so this is byte-exact for bolt's own check.
                body=raw.decode("utf-8", errors="replace"),
                query=request.query_string,
                headers={name: request.headers.getall(name) for name in request.headers},
            )
        except (ValueError, LookupError, TypeError, AttributeError, RecursionError):
            self.refusals.refused("unparsable")
            return web.json_response({"error": "bad request"}, status=400)
        if not _bolt_can_route(bolt_request.body):
            self.refusals.refused("malformed-envelope")
            return web.json_response({"error": "bad request"}, status=400)
        return await to_aiohttp_response(await self.app.async_dispatch(bolt_request))

    def _person_event(self, raw: bytes) -> dict[str, Any] | None:
        """The envelope, when ``raw`` is a person's message event we take without bolt."""
        if self.on_event is None or self.bot_user_id is None or raw[:1] != b"{":
            return None
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:  # NaN, huge integers, bad UTF-8: bolt's parse decides
            return None
        if not isinstance(body, dict) or body.get("type") != "event_callback":
            return None
        event = body.get("event")
        if not isinstance(event, dict):
            return None
        kind = event.get("type")  # may be any JSON value: a dict is not hashable
        return body if isinstance(kind, str) and kind in PERSON_EVENTS else None

    def _unsigned(self, headers: Mapping[str, str]) -> str | None:
        """Why the headers alone show the request is not from Slack, if they do."""
        signature = headers.get("X-Slack-Signature", "")
        if not _SIGNATURE.fullmatch(signature):
            return "no-signature"
        stamp = headers.get("X-Slack-Request-Timestamp", "")
        if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
            return "no-timestamp"
        if abs(self.clock() - int(stamp)) > TIMESTAMP_WINDOW:
            return "stale-timestamp"
        return None

    def _signed(self, raw: bytes, request: web.Request) -> bool:
        try:
            return self.verifier.is_valid(raw, request.headers.get("X-Slack-Request-Timestamp", ""),
                                          request.headers.get("X-Slack-Signature", ""))
        except ValueError:  # a missing or non-numeric timestamp
            return False


def _bolt_can_route(body: Mapping[str, Any]) -> bool:
    """False for envelope fields of a type bolt's middleware indexes without checking (it then
    answers 500). Slack never sends these; a signed body with them is a 400 like any junk."""
    event = body.get("event", {})
    if not isinstance(event, Mapping) or not isinstance(body.get("authorizations", []), list):
        return False
    return all(isinstance(event.get(key), str | None) for key in ("type", "channel_type"))
