"""The Slack Events API front: a bolt ``AsyncApp`` and the aiohttp bridge to it.

bolt does what Slack requires of an endpoint: the ``v0`` signature and the 5-minute timestamp
window, the ``url_verification`` handshake, ``auth.test`` on first use, and dropping our own
bot's events. We add the listeners: ``message`` and ``app_mention`` go to ``on_event`` and
every other event type is acknowledged with an empty 200, so Slack never sees a 404 for an
event it was told to send.

The bridge checks the signature itself (slack_sdk's ``SignatureVerifier``, the one bolt uses)
before bolt sees the request, because bolt parses the body first and some unsigned junk
(a JSON array, a broken ``payload=`` form) makes that parse raise: a forged or stale request is
a 401, a signed body bolt cannot parse a 400, never a 500. bolt then verifies again.

The app runs with ``process_before_response=True``: bolt answers once the listener has
returned, and ours awaits ``on_event``, which records the message (the answer waits on that
session write, never on a turn), so Slack's 200 (or the Socket Mode ack) means "recorded".
When ``on_event`` could not take the event (the gateway is shutting down, the store failed)
the answer is a 503, which Slack retries (over Socket Mode: no ack, so Slack resends).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.convert import SLASH_COMMAND

log = logging.getLogger("channels.slack")

EVENTS_PATH = "/slack/events"

OnCommand = Callable[[Mapping[str, Any]], Awaitable[str | None]]
"""Called with a ``/gateway`` slash-command payload; returns the text to answer the person
with at once (shown to them only), or None for an empty acknowledgement (the answer comes as
a message). Must be quick: Slack wants the acknowledgement within 3 seconds."""

OnEvent = Callable[[Mapping[str, Any], str | None], Awaitable[bool]]
"""Called with the envelope and our bot user id (from bolt's ``auth.test``) before Slack gets
its answer; True when the event was taken (recorded, or ignored on purpose), False for a 503.
Must be quick: Slack retries an event not answered within 3 seconds."""



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
    bolt_log = logging.getLogger("channels.slack.bolt")
    if not any(isinstance(f, _ClientTokenNotice) for f in bolt_log.filters):
        bolt_log.addFilter(_ClientTokenNotice())
    app = AsyncApp(
        # The client carries the token; passing token= as well only makes bolt log a warning.
        client=client,
        signing_secret=signing_secret or "",
        process_before_response=True,
        request_verification_enabled=verify_requests,
        logger=logging.getLogger("channels.slack.bolt"),
        name="gateway",
    )

    async def person_event(body: dict[str, Any],
                           context: AsyncBoltContext) -> BoltResponse | None:
        if await on_event(body, context.bot_user_id):
            return None  # bolt acknowledges: an empty 200
        return BoltResponse(status=503, body={"error": "not taken; retry later"})

    async def other_event() -> None:
        return None

    async def slash_command(ack: AsyncAck, body: dict[str, Any]) -> None:
        assert on_command is not None
        text = await on_command(body)
        await (ack(text=text) if text is not None else ack())

    if on_command is not None:
        app.command(SLASH_COMMAND)(slash_command)
    app.event("message")(person_event)
    app.event("app_mention")(person_event)
    # Registered last: bolt runs the first matching listener only.
    app.event(re.compile(".*"))(other_event)
    return app


class EventsEndpoint:
    """``POST /slack/events``: verify, hand to bolt, translate bolt's answer for aiohttp."""

    def __init__(self, app: AsyncApp, signing_secret: str) -> None:
        self.app = app
        self.verifier = SignatureVerifier(signing_secret)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if not self._signed(raw, request):
            log.warning("slack: refused an events request (bad signature or stale timestamp)")
            return web.json_response({"error": "invalid request"}, status=401)
        try:
            bolt_request = AsyncBoltRequest(
                # Slack's bodies are UTF-8, so this is byte-exact for bolt's own check.
                body=raw.decode("utf-8", errors="replace"),
                query=request.query_string,
                headers={name: request.headers.getall(name) for name in request.headers},
            )
        except (ValueError, LookupError, TypeError, AttributeError, RecursionError):
            log.warning("slack: refused a signed events request whose body does not parse")
            return web.json_response({"error": "bad request"}, status=400)
        if not _bolt_can_route(bolt_request.body):
            log.warning("slack: refused a signed events request with a malformed envelope")
            return web.json_response({"error": "bad request"}, status=400)
        return await to_aiohttp_response(await self.app.async_dispatch(bolt_request))

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
