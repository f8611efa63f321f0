"""Channels on several workers: one Telegram poller per bot, elected through Redis, and the
standby takes over when the polling worker shuts down."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.compose import build_gateway
from app.server import Gateway
from channels.telegram.adapter import TelegramChannel
from tests.channels.test_telegram_harness import ALICE, telegram_settings
from tests.coordination.harness import wait_until
from tests.coordination.services import REDIS_URL
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer
from tests.sessions.pg import PG_URL

pytestmark = pytest.mark.services


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


def telegram_of(gateway: Gateway) -> TelegramChannel:
    [channel] = gateway.channels
    assert isinstance(channel, TelegramChannel)
    return channel


def leading(gateways: list[Gateway]) -> list[Gateway]:
    return [g for g in gateways if telegram_of(g).health().get("leader")]


async def test_one_worker_polls_and_the_other_takes_over(
    fake: FakeTelegramServer, prefix: str, schema: str, tmp_path: Path
) -> None:
    """Only the elected worker polls (no 409s); when it stops, the standby polls and answers."""
    gateways = []
    for n in range(2):
        settings = telegram_settings(
            fake, tmp_path / f"w{n}", GATEWAY_REDIS_URL=REDIS_URL, GATEWAY_REDIS_PREFIX=prefix,
            GATEWAY_STORE_URL=PG_URL, GATEWAY_STORE_SCHEMA=schema, GATEWAY_LEASE_TTL=1.5)
        gateways.append(build_gateway(settings, provider=ScriptedProvider()))
    try:
        for gateway in gateways:
            await gateway.start()
        await wait_until(lambda: len(leading(gateways)) == 1)
        [first] = leading(gateways)
        for n in range(5):
            fake.user_message(ALICE, f"hello {n}")
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 5)
        assert all(telegram_of(g).health()["ok"] for g in gateways)  # standby is healthy
        await first.aclose()
        [second] = [g for g in gateways if g is not first]
        await wait_until(lambda: leading([second]) == [second], 5)
        for n in range(5, 8):
            fake.user_message(ALICE, f"hello {n}")
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 8)
        conflicts = [telegram_of(g).health()["conflicts"] for g in gateways]
        log = await second.store.read_log(
            "default", str(await second.store.latest_session("default", f"telegram:{ALICE}")))
    finally:
        for gateway in gateways:
            await gateway.aclose()
    assert fake.texts_to(ALICE) == ["ok"] * 8
    assert conflicts == [0, 0]
    assert [line for line in log.splitlines() if b'"role":"user"' in line].__len__() == 8


async def test_a_slack_file_is_fetched_by_the_worker_serving_its_message(
    prefix: str, schema: str, tmp_path: Path
) -> None:
    """Two workers: a Slack message with a file is acknowledged while the download is held,
    owed in the database with the file's reference, and answered once with the file by
    whichever worker serves it."""
    from channels.slack.adapter import SlackChannel
    from tests.channels.test_slack_gateway import events_url, slack_settings, thread_texts
    from tests.fakes import media
    from tests.fakes.slack_api import FakeSlackServer

    photo = media.jpeg(64, 48)
    providers = [ScriptedProvider(), ScriptedProvider()]
    async with FakeSlackServer() as slack:
        gateways = [build_gateway(slack_settings(
            slack, tmp_path / f"w{n}", GATEWAY_REDIS_URL=REDIS_URL, GATEWAY_REDIS_PREFIX=prefix,
            GATEWAY_STORE_URL=PG_URL, GATEWAY_STORE_SCHEMA=schema), provider=providers[n])
            for n in range(2)]
        try:
            for gateway in gateways:
                await gateway.start()
            assert all(isinstance(g.channels[0], SlackChannel) for g in gateways)
            slack.downloads.close()
            hosted = slack.add_file(photo, "cat.jpg", "image/jpeg")
            envelope = slack.file_event(slack.im_channel_for("U1"), "U1", [hosted], "what?")
            ack = await slack.deliver_event(events_url(gateways[0]), envelope, timeout=10)
            await wait_until(lambda: slack.downloads.waiting == 1)
            slack.downloads.open()
            event = envelope["event"]
            await wait_until(lambda: thread_texts(slack, event["channel"], event["ts"]) != [])
        finally:
            for gateway in gateways:
                await gateway.aclose()
    assert ack == (200, "")
    assert thread_texts(slack, event["channel"], event["ts"]) == ["ok"]
    [body] = [body for provider in providers for body in provider.bodies]
    assert body["messages"][-1]["content"][0]["type"] == "image"
    assert len(slack.files_served) == 1
