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
