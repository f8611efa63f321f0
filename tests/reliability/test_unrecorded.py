"""Acknowledge only what is recorded: when the store cannot record a message, no platform is
told it was received (503 with Retry-After to Slack, Telegram webhooks and the web API; the
Telegram polling offset held), the failure is logged once per episode, and once the store
is back the platform's redelivery is recorded and answered once."""

from __future__ import annotations

import errno
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from coordination.local import InProcessCoordinator
from gateway.edge.errors import RETRY_AFTER
from tests.channels.test_slack_gateway import slack_settings
from tests.channels.test_telegram_harness import ALICE, telegram_settings, wait_until
from tests.fakes.journal import FaultyJournal
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer
from tests.reliability.support import session_files, web_gateway, web_settings

FULL = OSError(errno.ENOSPC, "No space left on device")
SECRET = "s3cret_Token-1"


@asynccontextmanager
async def running(settings: Settings, journal: FaultyJournal) -> AsyncIterator[Gateway]:
    gateway = build_gateway(settings, provider=ScriptedProvider(),
                            coordinator=InProcessCoordinator(journal=journal))
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.aclose()


def journal_of(data_dir: Path) -> FaultyJournal:
    return FaultyJournal(data_dir / "state" / "delivery.jsonl")


def episode_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("writing the owed journal")]


async def test_slack_gets_503_with_retry_after_until_the_store_records_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Slack's deliveries are refused with 503 + Retry-After while nothing can be written (one
    log line for the episode); its retry after recovery is recorded and answered once."""
    caplog.set_level(logging.INFO)
    journal = journal_of(tmp_path)
    async with FakeSlackServer() as fake, running(slack_settings(fake, tmp_path),
                                                  journal) as gateway:
        url = f"http://127.0.0.1:{gateway.bound_port}/slack/events"
        envelope = fake.dm_event("U1", "hello")
        journal.fault = FULL
        refused = [await fake.deliver_event(url, envelope, retry_num=n or None)
                   for n in range(3)]
        headers = fake.last_headers
        recorded_during = session_files(tmp_path)
        journal.fault = None
        assert (await fake.deliver_event(url, envelope, retry_num=3))[0] == 200
        await wait_until(lambda: len(fake.posts()) == 1)
    assert [(status, orjson.loads(body)) for status, body in refused] == [
        (503, {"error": "store unavailable"})] * 3
    assert headers.get("Retry-After") == str(RETRY_AFTER)
    assert recorded_during == []
    assert len(session_files(tmp_path)) == 1
    assert len(episode_lines(caplog)) == 2  # the failure, then the recovery


async def test_telegram_webhook_gets_503_with_retry_after(tmp_path: Path) -> None:
    """A webhook update that cannot be recorded gets 503 + Retry-After; Telegram's next try
    is recorded and answered once."""
    journal = journal_of(tmp_path)
    async with FakeTelegramServer() as fake, running(
            telegram_settings(fake, tmp_path, TELEGRAM_MODE="webhook",
                              TELEGRAM_WEBHOOK_SECRET=SECRET), journal) as gateway:
        url = f"http://127.0.0.1:{gateway.bound_port}/telegram/webhook"
        update = fake.user_message(ALICE, "hello")
        fake.pending_updates.clear()
        journal.fault = FULL
        status, body = await fake.deliver_webhook(url, update, secret=SECRET)
        headers = fake.last_headers
        journal.fault = None
        again, _ = await fake.deliver_webhook(url, update, secret=SECRET)
        await wait_until(lambda: fake.texts_to(ALICE) == ["ok"])
    assert (status, orjson.loads(body)) == (503, {"error": "store unavailable"})
    assert headers.get("Retry-After") == str(RETRY_AFTER)
    assert again == 200


async def test_telegram_polling_holds_its_offset_until_the_update_is_recorded(
        tmp_path: Path) -> None:
    """Long polling does not confirm an update it could not record: the offset stays, the
    update is asked for again, and once the store is back it is recorded and answered once."""
    journal = journal_of(tmp_path)
    async with FakeTelegramServer() as fake, running(telegram_settings(fake, tmp_path),
                                                     journal) as gateway:
        journal.fault = FULL
        update = fake.user_message(ALICE, "hello")
        await wait_until(lambda: journal.refused >= 3)  # tried again, and again
        held = fake.confirmed_offset
        assert gateway.router.queued == 0
        journal.fault = None
        await wait_until(lambda: fake.texts_to(ALICE) == ["ok"], timeout=15)
        await wait_until(lambda: fake.confirmed_offset > update["update_id"], timeout=15)
    assert held <= update["update_id"]
    assert fake.texts_to(ALICE) == ["ok"]


async def test_web_gets_a_json_503_naming_the_store(tmp_path: Path) -> None:
    """The web API answers 503 {"error": "store unavailable"} with Retry-After, nothing kept."""
    journal = journal_of(tmp_path)
    settings = web_settings(tmp_path)
    async with web_gateway(settings, coordinator=InProcessCoordinator(journal=journal)) as web:
        journal.fault = FULL
        async with web.http.post(web.base + "/api/chat",
                                 json={"conversation": "c", "text": "hi"}) as response:
            status, body = response.status, await response.json()
            retry = response.headers.get("Retry-After")
        journal.fault = None
        ok = await web.chat("c", "hi again")
    assert (status, body, retry) == (503, {"error": "store unavailable"}, str(RETRY_AFTER))
    assert ok[0] == 200
    assert "session" in ok[1]
