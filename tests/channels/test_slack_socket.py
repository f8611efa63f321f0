"""The Slack channel in Socket Mode: events pushed over the fake's WebSocket, real gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.channels.test_slack_gateway import (
    running,
    slack_settings,
    thread_texts,
    turns,
    wait_until,
)
from tests.fakes.slack_api import FakeSlackServer


async def test_socket_event_acked_and_answered(tmp_path: Path) -> None:
    """An event pushed over Socket Mode is acknowledged, answered in its thread; close is clean."""
    async with FakeSlackServer() as fake:
        settings = slack_settings(fake, tmp_path, SLACK_APP_TOKEN=fake.app_token,
                                  SLACK_SIGNING_SECRET=None)
        async with running(settings) as gateway:
            await asyncio.wait_for(fake.socket_connected.wait(), 5)
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
    assert after == {"ok": False, "mode": "socket", "events": 1, "last_error": None}
    assert fake.socket_connections == 1


async def test_socket_event_not_taken_is_not_acked(tmp_path: Path) -> None:
    """Over Socket Mode an event the router cannot take gets no ack (so Slack resends it);
    the resent envelope is acked, recorded and answered."""
    async with FakeSlackServer() as fake:
        settings = slack_settings(fake, tmp_path, SLACK_APP_TOKEN=fake.app_token,
                                  SLACK_SIGNING_SECRET=None)
        async with running(settings) as gateway:
            await asyncio.wait_for(fake.socket_connected.wait(), 5)
            envelope = fake.dm_event("U1", "while closing")
            gateway.router._closing = True  # as in shutdown: the router takes no more input
            refused = await fake.socket_send_event(envelope)
            await wait_until(lambda: gateway.channels[0].health()["events"] == 1)
            await asyncio.sleep(0.2)  # an ack would have arrived by now
            gateway.router._closing = False
            resent = await fake.socket_send_event(envelope, retry_attempt=1,
                                                  retry_reason="timeout")
            ack = await fake.wait_for_ack(resent)
            await wait_until(lambda: turns(gateway) == 1)
    event = envelope["event"]
    assert [a for a in fake.socket_acks if a.get("envelope_id") == refused] == []
    assert ack == {"envelope_id": resent}
    assert thread_texts(fake, event["channel"], event["ts"]) == ["ok"]
