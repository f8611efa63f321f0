"""The Slack channel in Socket Mode: events pushed over the fake's WebSocket, real gateway."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tests.channels.test_slack_gateway import (
    running,
    slack_settings,
    thread_texts,
    turns,
    wait_until,
)
from tests.fakes.slack_api import FakeSlackServer
from tests.waiting import WAIT


async def test_socket_event_acked_and_answered(tmp_path: Path) -> None:
    """An event pushed over Socket Mode is acknowledged, answered in its thread; close is clean."""
    async with FakeSlackServer() as fake:
        settings = slack_settings(fake, tmp_path, SLACK_APP_TOKEN=fake.app_token,
                                  SLACK_SIGNING_SECRET=None)
        async with running(settings) as gateway:
            await asyncio.wait_for(fake.socket_connected.wait(), WAIT)
            envelope = fake.dm_event("U1", "over the socket")
            envelope_id = await fake.socket_send_event(envelope)
            ack = await fake.wait_for_ack(envelope_id)
            await wait_until(lambda: turns(gateway) == 1)
            health = dict(gateway.channels[0].health())
            routes = [r.resource.canonical for r in gateway.web_app.router.routes()
                      if r.resource is not None]
        await wait_until(lambda: not fake.socket_connected.is_set())
        await gateway.channels[0].aclose()  # a second close is a no-op
        after = dict(gateway.channels[0].health())
    event = envelope["event"]
    assert ack == {"envelope_id": envelope_id}
    assert thread_texts(fake, event["channel"], event["ts"]) == ["ok"]
    assert health == {"ok": True, "mode": "socket", "events": 1, "last_error": None}
    assert "/slack/events" not in routes
    # Unhealthy once closed, and says why (a null reason next to "ok": false told nothing).
    assert after == {"ok": False, "mode": "socket", "events": 1, "last_error": "not running"}
    assert fake.socket_connections == 1


async def test_socket_event_not_taken_is_not_acked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Over Socket Mode an event the router cannot take (it is stopping) gets no ack, so Slack
    resends it; the resent envelope reaches the next gateway, which acks, records and answers."""
    caplog.set_level(logging.INFO, logger="channels.slack")
    async with FakeSlackServer() as fake:
        settings = slack_settings(fake, tmp_path, SLACK_APP_TOKEN=fake.app_token,
                                  SLACK_SIGNING_SECRET=None)
        envelope = fake.dm_event("U1", "while closing")
        async with running(settings) as gateway:
            await wait_until(fake.socket_connected.is_set)
            await gateway.router.drain(0)  # as in shutdown: the router takes no more input
            refused = await fake.socket_send_event(envelope)
            await wait_until(lambda: any("not taken: the gateway is shutting down"
                                         in r.getMessage() for r in caplog.records))
            # The refusal is decided (logged) before an ack of it could go out; an envelope
            # pushed only now, and acked, shows the socket's acks have moved past that point.
            ignored = fake.dm_event("U1", "a bot's own message")
            ignored["event"]["bot_id"] = "B0OTHER"
            await fake.wait_for_ack(await fake.socket_send_event(ignored))
        await wait_until(lambda: not fake.socket_connected.is_set())
        async with running(settings) as second:
            await wait_until(fake.socket_connected.is_set)
            resent = await fake.socket_send_event(envelope, retry_attempt=1,
                                                  retry_reason="timeout")
            ack = await fake.wait_for_ack(resent)
            await wait_until(lambda: turns(second) == 1)
    event = envelope["event"]
    assert [a for a in fake.socket_acks if a.get("envelope_id") == refused] == []
    assert ack == {"envelope_id": resent}
    assert thread_texts(fake, event["channel"], event["ts"]) == ["ok"]
