"""The Slack Events API front: a bolt ``AsyncApp`` and the aiohttp bridge to it.

bolt does what Slack requires of an endpoint: the ``v0`` signature and the 5-minute timestamp
window (401 on a forged or stale request), the ``url_verification`` handshake, ``auth.test``
on first use, and dropping our own bot's events. We add the listeners: ``message`` and
``app_mention`` go to ``on_event`` and every other event type is acknowledged with an empty
200, so Slack never sees a 404 for an event it was told to send.

The app runs with ``process_before_response=True``: bolt answers once the listener has
returned, and ours only converts and queues the event (no I/O), so the answer never waits on
a session write or a turn, and no task is left to bolt's own scheduling.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

EVENTS_PATH = "/slack/events"

OnEvent = Callable[[Mapping[str, Any], str | None], None]
"""Called with the envelope and our bot user id (from bolt's ``auth.test``); must not block."""


def build_app(client: AsyncWebClient, *, signing_secret: str | None, on_event: OnEvent,
              verify_requests: bool = True) -> AsyncApp:
    """A bolt app over ``client`` (which carries the bot token and the API base URL).

    ``verify_requests`` is False only for Socket Mode, where nothing comes in over HTTP (bolt
    skips verification for socket requests anyway).
    """
    app = AsyncApp(
        # The client carries the token; passing token= as well only makes bolt log a warning.
        client=client,
        signing_secret=signing_secret or "",
        process_before_response=True,
        request_verification_enabled=verify_requests,
        logger=logging.getLogger("channels.slack.bolt"),
        name="gateway",
    )

    async def person_event(body: dict[str, Any], context: AsyncBoltContext) -> None:
        on_event(body, context.bot_user_id)

    async def other_event() -> None:
        return None

    app.event("message")(person_event)
    app.event("app_mention")(person_event)
    # Registered last: bolt runs the first matching listener only.
    app.event(re.compile(".*"))(other_event)
    return app


async def dispatch(app: AsyncApp, request: web.Request) -> web.Response:
    """Run one HTTP request through bolt and translate its answer for aiohttp."""
    bolt_request = await to_bolt_request(request)
    return await to_aiohttp_response(await app.async_dispatch(bolt_request))
