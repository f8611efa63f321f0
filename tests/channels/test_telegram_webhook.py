"""The Telegram channel in webhook mode: POST /telegram/webhook on the gateway's own server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from gateway.edge.errors import ConfigError
from tests.channels.test_telegram_harness import (
    ALICE,
    channel_of,
    metric,
    running,
    running_on_a_named_port,
    sessions,
    settled,
    telegram_settings,
    wait_until,
)
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer
from tests.waiting import WAIT

SECRET = "s3cret_Token-1"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


def webhook_env(**extra: Any) -> dict[str, Any]:
    return {"TELEGRAM_MODE": "webhook", "TELEGRAM_WEBHOOK_SECRET": SECRET, **extra}


def url_of(gateway: Gateway) -> str:
    return f"http://127.0.0.1:{gateway.bound_port}/telegram/webhook"


async def test_webhook_round_trip(fake: FakeTelegramServer, tmp_path: Path) -> None:
    """setWebhook is called with the secret at start; Telegram's pushes are answered."""
    provider = ScriptedProvider()
    provider.script("Hi **there**")

    def settings_for(port: int) -> Settings:
        url = f"http://127.0.0.1:{port}/telegram/webhook"
        return telegram_settings(fake, tmp_path, GATEWAY_PORT=port,
                                 **webhook_env(TELEGRAM_WEBHOOK_URL=url))

    async with running_on_a_named_port(settings_for, provider) as gateway:
        url = url_of(gateway)
        assert fake.webhook is not None
        assert (fake.webhook.url, fake.webhook.secret_token) == (url, SECRET)
        assert fake.webhook.allowed_updates == ["message"]
        fake.user_message(ALICE, "hello")  # the fake pushes it to the webhook
        await settled(gateway, 1)
        assert await sessions(gateway) == [(f"telegram:{ALICE}", "hello")]
        health = channel_of(gateway).health()
    assert [d.status for d in fake.webhook_deliveries] == [200]
    assert fake.texts_to(ALICE) == ["Hi there"]
    assert fake.get_updates_calls == 0
    assert health == {"ok": True, "mode": "webhook", "last_poll_ok": None, "conflicts": 0,
                      "stalls": 0, "last_error": None}


async def test_webhook_answers_before_the_turn(fake: FakeTelegramServer, tmp_path: Path) -> None:
    """The HTTP answer comes once the message is recorded, not after the (slow) turn."""
    provider = ScriptedProvider(delay=1.5)
    async with running(telegram_settings(fake, tmp_path, **webhook_env()), provider) as gateway:
        started = time.monotonic()
        status, _ = await fake.deliver_webhook(url_of(gateway), _update(fake), secret=SECRET)
        answered = time.monotonic() - started
        assert await sessions(gateway) == [(f"telegram:{ALICE}", "hello")]
        await settled(gateway, 1, timeout=WAIT)
    assert status == 200
    assert answered < 1.0
    assert fake.texts_to(ALICE) == ["ok"]


@pytest.mark.parametrize("secret", [None, "wrong", SECRET + "x", ""])
async def test_wrong_or_missing_secret_is_forbidden(
    fake: FakeTelegramServer, tmp_path: Path, secret: str | None
) -> None:
    """Without the exact secret token: 403, nothing recorded, nothing remembered."""
    async with running(telegram_settings(fake, tmp_path, **webhook_env())) as gateway:
        status, _ = await fake.deliver_webhook(url_of(gateway), _update(fake), secret=secret)
        assert await sessions(gateway) == []
        inbound = metric(gateway, "gateway_inbound_total")
    assert status == 403
    assert inbound == 0
    assert fake.texts_to(ALICE) == []
    assert (tmp_path / "state" / "delivery.jsonl").read_bytes() == b""  # nothing owed


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (b'{"message": {}}', 400),  # no update_id
        (b'{"update_id": 5, "message": {"text": "no chat"}}', 400),
        (b'{"update_id": 5, "message": {}}'.ljust(300 * 1024), 413),
    ],
)
async def test_bad_bodies_refused(fake: FakeTelegramServer, tmp_path: Path, body: bytes,
                                  status: int) -> None:
    """Malformed JSON or a non-Update is 400, an oversized body 413; nothing is recorded."""
    async with running(telegram_settings(fake, tmp_path, **webhook_env())) as gateway:
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET,
                   "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http, http.post(
            url_of(gateway), data=body, headers=headers
        ) as response:
            assert response.status == status
        assert await sessions(gateway) == []


async def test_webhook_without_secret_refuses_to_start(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """TELEGRAM_MODE=webhook without TELEGRAM_WEBHOOK_SECRET is a ConfigError naming it."""
    settings = telegram_settings(fake, tmp_path, TELEGRAM_MODE="webhook")
    with pytest.raises(ConfigError, match="TELEGRAM_WEBHOOK_SECRET"):
        build_gateway(settings, provider=ScriptedProvider())
    assert fake.sent == []


async def test_redelivered_webhook_update_dropped(fake: FakeTelegramServer,
                                                  tmp_path: Path) -> None:
    """Telegram retrying an update it already pushed gets 200 and no second answer."""
    async with running(telegram_settings(fake, tmp_path, **webhook_env())) as gateway:
        update = _update(fake)
        for _ in range(2):
            status, _ = await fake.deliver_webhook(url_of(gateway), update, secret=SECRET)
            assert status == 200
        await settled(gateway, 1)
        await wait_until(lambda: metric(gateway, "gateway_duplicates_dropped_total") == 1)
    assert fake.texts_to(ALICE) == ["ok"]


def _update(fake: FakeTelegramServer) -> dict[str, Any]:
    """A DM update built by the fake but not queued (webhooks are delivered by hand here)."""
    update = fake.user_message(ALICE, "hello")
    fake.pending_updates.clear()
    return update


@pytest.mark.parametrize(
    "wrong",
    [{"text": {"an": "object"}}, {"text": ["a", "list"]}, {"text": 42},
     {"caption": {"x": 1}, "document": {"file_id": "f", "file_unique_id": "u",
                                        "file_name": {"y": 2}}}],
    ids=["text-object", "text-list", "text-number", "document-fields"],
)
async def test_an_update_with_fields_of_the_wrong_type_is_a_400(
    fake: FakeTelegramServer, tmp_path: Path, wrong: dict[str, Any]
) -> None:
    """A signed update whose ``text`` (or a file's fields) is an object, a list or a number
    is refused with 400, never a 500 that Telegram would retry; nothing is recorded."""
    update = _update(fake)
    message = update["message"]
    message.pop("text")
    message.pop("entities", None)
    message.update(wrong)
    async with running(telegram_settings(fake, tmp_path, **webhook_env())) as gateway:
        status, _ = await fake.deliver_webhook(url_of(gateway), update, secret=SECRET)
        assert await sessions(gateway) == []
        malformed = metric(gateway, "gateway_channel_errors_total", kind="malformed")
    assert (status, malformed) == (400, 1)
