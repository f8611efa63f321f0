"""The harness of the Telegram end-to-end tests (the real gateway against the fake Bot API),
and the tests of the channel's own plumbing: health, start-up failures, closing, logging."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import telegram

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from channels.telegram.adapter import TelegramChannel
from gateway.edge.errors import ChannelError, ConfigError
from gateway.edge.provider import Provider
from sessions.replay import Replay, replay_bytes
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer, SentCall
from tests.ports import PORT_TRIES, address_in_use, free_port
from tests.waiting import WAIT, until, until_progress

wait_until = until  # polled waits: see tests/waiting.py

ALICE = 1001
BOB = 1002
GROUP_USER = 424242  # the fake's default sender in groups
ALLOWED = f"{ALICE},{BOB},{GROUP_USER}"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


def telegram_settings(fake: FakeTelegramServer, data_dir: Path, **extra: Any) -> Settings:
    """Settings for a Telegram-only gateway on 127.0.0.1 polling ``fake``."""
    values: dict[str, Any] = {
        "GATEWAY_DATA_DIR": str(data_dir), "GATEWAY_PORT": 0, "GATEWAY_CHANNELS": "telegram",
        "GATEWAY_SHUTDOWN_GRACE": 2, "TELEGRAM_BOT_TOKEN": fake.token,
        "TELEGRAM_API_BASE_URL": fake.base_url, "TELEGRAM_RATE_LIMIT": "off",
        "TELEGRAM_POLL_TIMEOUT": 1, "TELEGRAM_STALL_SECONDS": 5,
        "TELEGRAM_ALLOWED_USERS": ALLOWED,
        # Typing at once, so call sequences are the same on a fast or a loaded machine.
        "GATEWAY_TYPING_DELAY": 0,
    }
    values.update(extra)
    # _env_file is an init-only option of pydantic-settings that mypy cannot see.
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@asynccontextmanager
async def running(settings: Settings, provider: Provider | None = None, *,
                  edit_interval: float | None = None) -> AsyncIterator[Gateway]:
    gateway = build_gateway(settings, provider=provider or ScriptedProvider())
    if edit_interval is not None:
        channel_of(gateway).edit_interval = edit_interval
    try:
        await gateway.start()
        yield gateway
    finally:
        await gateway.aclose()


def channel_of(gateway: Gateway) -> TelegramChannel:
    channel = gateway.channels[0]
    assert isinstance(channel, TelegramChannel)
    return channel


@asynccontextmanager
async def running_on_a_named_port(settings_for: Callable[[int], Settings],
                                  provider: Provider | None = None) -> AsyncIterator[Gateway]:
    """:func:`running`, for a gateway that must know its port before it starts (a webhook URL
    names it): ``settings_for(port)`` on a free port, then on another while the one found was
    taken before the gateway bound it (:data:`tests.ports.PORT_TRIES` times)."""
    for _ in range(PORT_TRIES):
        gateway = build_gateway(settings_for(free_port()), provider=provider or ScriptedProvider())
        try:
            await gateway.start()
        except ConfigError as exc:
            await gateway.aclose()
            if address_in_use(str(exc)):
                continue  # taken since free_port() found it: another one
            raise
        try:
            yield gateway
        finally:
            await gateway.aclose()
        return
    raise RuntimeError(f"the gateway found no free port in {PORT_TRIES} tries")


def metric(gateway: Gateway, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in gateway.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def turns(gateway: Gateway) -> float:
    return metric(gateway, "gateway_turns_total", channel="telegram")


async def settled(gateway: Gateway, answered: int, timeout: float = WAIT) -> None:  # noqa: ASYNC109
    """Wait until ``answered`` turns finished and every reply has been written; ``timeout``
    bounds a stall (no turn finished for that long), not the whole wait, so a thousand
    messages on a busy machine take what they take."""
    channel = channel_of(gateway)
    await until_progress(lambda: turns(gateway) >= answered and channel.pending_replies == 0,
                         lambda: (turns(gateway), channel.pending_replies), stall=timeout,
                         what=f"{answered} turns answered")


async def healthz(gateway: Gateway) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(
        f"http://127.0.0.1:{gateway.bound_port}/healthz"
    ) as response:
        body: dict[str, Any] = await response.json()
        return response.status, body["channels"]["telegram"]


async def sessions(gateway: Gateway) -> list[tuple[str | None, str | None]]:
    """(conversation, first user text) of every session, sorted."""
    infos = await gateway.store.list_sessions("default")
    return sorted((info.conversation, info.first_user_text) for info in infos)


async def replay_of(gateway: Gateway, conversation: str) -> Replay:
    infos = [i for i in await gateway.store.list_sessions("default")
             if i.conversation == conversation]
    assert len(infos) == 1, infos
    return replay_bytes(await gateway.store.read_log("default", infos[0].session_id))


def user_texts(replay: Replay) -> list[str]:
    return [str(m["content"]) for m in replay.messages if m["role"] == "user"]


def ok_calls(fake: FakeTelegramServer, method: str) -> list[SentCall]:
    return [c for c in fake.calls(method) if c.ok]


# -- the channel's own plumbing ---------------------------------------------------------------


async def test_health_reports_polling(fake: FakeTelegramServer, tmp_path: Path) -> None:
    """/healthz shows the polling channel's health fields, secret-free, once a poll succeeded."""
    async with running(telegram_settings(fake, tmp_path)) as gateway:
        await wait_until(lambda: channel_of(gateway).health()["last_poll_ok"] is not None)
        status, health = await healthz(gateway)
    assert status == 200
    assert health["ok"] is True
    assert {k: health[k] for k in ("mode", "conflicts", "stalls", "last_error")} == {
        "mode": "polling", "conflicts": 0, "stalls": 0, "last_error": None}
    assert fake.token not in repr(health)
    assert fake.last_get_updates_params is not None
    assert fake.last_get_updates_params["allowed_updates"] == ["message"]


async def test_rejected_token_fails_start_without_leaking_it(
    fake: FakeTelegramServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 401 on getMe stops the start with a ChannelError whose text and chain lack the token."""
    caplog.set_level(logging.DEBUG, logger="channels.telegram")
    wrong = "987654321:WrongTokenWrongTokenWrongToken"
    settings = telegram_settings(fake, tmp_path, TELEGRAM_BOT_TOKEN=wrong)
    with pytest.raises(ChannelError) as caught:
        async with running(settings):
            pass
    assert "unauthorized" in str(caught.value)
    chain: BaseException | None = caught.value
    while chain is not None:
        assert wrong not in str(chain)
        chain = chain.__cause__
    assert wrong not in caplog.text


async def test_delivery_errors_logged_without_token_and_counted(
    fake: FakeTelegramServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sendMessage that keeps failing (the answer's placeholder, tried three times) is a
    log line each (no token) and a channel_errors sample each; with no message to edit, the
    answer is not sent."""
    caplog.set_level(logging.DEBUG, logger="channels.telegram")
    provider = ScriptedProvider()
    provider.script({"role": "assistant", "content": [{"type": "text", "text": "hi"}]})
    async with running(telegram_settings(fake, tmp_path), provider) as gateway:
        fake.fail_next("sendMessage", 500, times=3)
        fake.user_message(ALICE, "hello")
        await settled(gateway, 1)
        errors = metric(gateway, "gateway_channel_errors_total", channel="telegram",
                        kind="network")
    assert errors == 3
    assert [c.error_code for c in fake.calls("sendMessage")] == [500, 500, 500]
    assert fake.calls("editMessageText") == []
    assert caplog.text.count("sendMessage (placeholder) failed (network") == 3
    assert fake.token not in caplog.text


async def test_a_failed_call_of_an_answer_is_tried_again(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """A placeholder and a final edit that fail once each (5xx) are tried again: the answer
    arrives, in one message (an edit lands the same however often it is made)."""
    provider = ScriptedProvider()
    provider.script("the answer")
    async with running(telegram_settings(fake, tmp_path), provider) as gateway:
        fake.fail_next("sendMessage", 502)
        fake.fail_next("editMessageText", 500)
        fake.user_message(ALICE, "hello")
        await settled(gateway, 1)
    assert [c.error_code for c in fake.calls("sendMessage")] == [502, None]
    assert [c.error_code for c in fake.calls("editMessageText")] == [500, None]
    assert fake.texts_to(ALICE) == ["the answer"]


async def test_aclose_is_idempotent_and_stops_polling(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """Closing twice is fine; after close no poll is running and health says not ok."""
    async with running(telegram_settings(fake, tmp_path)) as gateway:
        await wait_until(lambda: fake.get_updates_active == 1)
        channel = channel_of(gateway)
        await channel.aclose()
        await channel.aclose()
        await wait_until(lambda: fake.get_updates_active == 0)
        assert channel.health()["ok"] is False
        assert channel.health()["last_error"] == "not polling"  # never null while unhealthy
        calls = fake.get_updates_calls
        # A poll sent before now would be in by the time the fake has answered a later call.
        async with telegram.Bot(fake.token, base_url=fake.base_url) as probe:
            await probe.get_me()
        assert fake.get_updates_calls == calls
