"""Telegram end to end at the gateway level: access control and pairing, many chats at once,
and replay of every provider call a Telegram conversation made."""

from __future__ import annotations

import asyncio
import io
import logging
import re
from collections.abc import AsyncIterator
from contextlib import redirect_stdout
from pathlib import Path

import orjson
import pytest

from app.cli import main as cli_main
from coordination.file_pairing import FilePairingState
from gateway.edge.pairing import PairingStore
from providers.anthropic import AnthropicProvider
from providers.offline import OfflineProvider
from tests.channels.test_telegram_harness import (
    ALICE,
    replay_of,
    running,
    sessions,
    settled,
    telegram_settings,
    user_texts,
    wait_until,
)
from tests.fakes.providers import FakeProviderServer, Reply
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer

STRANGER = 777


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


async def test_pairing_end_to_end(fake: FakeTelegramServer, tmp_path: Path,
                                  caplog: pytest.LogCaptureFixture) -> None:
    """A stranger's DM gets a pairing code (never logged); once approved, they are answered."""
    caplog.set_level(logging.DEBUG)
    for noisy in ("httpx", "httpcore", "telegram"):  # as app.logs.configure does
        caplog.set_level(logging.WARNING, logger=noisy)
    provider = ScriptedProvider()
    provider.script("welcome!")
    async with running(telegram_settings(fake, tmp_path), provider) as gateway:
        fake.user_message(STRANGER, "hello?")
        await wait_until(lambda: len(fake.texts_to(STRANGER)) == 1)
        [notice] = fake.texts_to(STRANGER)
        match = re.search(r"gateway pairing approve (\w+)", notice)
        assert match is not None
        code = match.group(1)
        assert await sessions(gateway) == []
        PairingStore(FilePairingState.under(tmp_path)).approve(code)
        fake.user_message(STRANGER, "hello again")
        await settled(gateway, 1)
        assert await sessions(gateway) == [(f"telegram:{STRANGER}", "hello again")]
    assert fake.texts_to(STRANGER) == [notice, "welcome!"]
    assert code not in caplog.text


async def test_allowlist_by_username_and_silent_refusals(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """@username allowlists pass; a group nobody allowed gets no answer even when mentioned."""
    settings = telegram_settings(fake, tmp_path, TELEGRAM_ALLOWED_USERS="@carol",
                                 GATEWAY_PAIRING=False)
    async with running(settings) as gateway:
        fake.user_message(-100999, "@fake_test_bot hi", chat_type="supergroup", user_id=5)
        fake.user_message(ALICE, "let me in")  # not allowlisted, pairing off
        fake.user_message(888, "hi", username="carol")
        await settled(gateway, 1)
        assert await sessions(gateway) == [("telegram:888", "hi")]
    assert fake.texts_to(888) == ["ok"]
    assert fake.texts_to(ALICE) == []
    assert fake.texts_to(-100999) == []


async def test_many_chats_every_reply_once_in_order(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """50 chats x 20 messages: each answered once, per-chat order kept in replies and logs."""
    chats = list(range(5001, 5051))
    users = ",".join(str(c) for c in chats)
    # Durability is not what this test is about; skipping 1,000 fsyncs keeps it quick.
    settings = telegram_settings(fake, tmp_path, TELEGRAM_ALLOWED_USERS=users,
                                 GATEWAY_DURABILITY="none")
    async with running(settings, OfflineProvider()) as gateway:
        for i in range(20):
            for chat in chats:
                fake.user_message(chat, f"m{i:02d}")
        await settled(gateway, 1000)
        logs = {chat: user_texts(await replay_of(gateway, f"telegram:{chat}"))
                for chat in chats}
    expected = [f"m{i:02d}" for i in range(20)]
    for chat in chats:
        said = [re.search(r'You said: "(m\d\d)"', t) for t in fake.texts_to(chat)]
        assert [m.group(1) for m in said if m] == expected, chat
        assert logs[chat] == expected, chat
    assert all(c.ok for c in fake.sent)


def replay_cli(data_dir: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli_main(["replay", "--data-dir", str(data_dir), *args])
    return code, out.getvalue()


async def test_conversation_across_restart_replays_every_call(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """Across a restart and a redelivery, every provider request equals its replay (API, CLI)."""
    async with FakeProviderServer() as srv:
        srv.script("anthropic", Reply.text("Hello **Alice**."),
                   Reply.tool_use("memory_write", {"text": "Alice likes tea"},
                                  text_before="Noting that."),
                   Reply.text("Tea it is."))

        def provider() -> AnthropicProvider:
            return AnthropicProvider(api_key="test-key", model="claude-test",
                                     base_url=srv.anthropic_base_url, max_retries=0)

        settings = telegram_settings(fake, tmp_path)
        async with running(settings, provider()) as gateway:
            first = fake.user_message(ALICE, "hi, I'm Alice")
            await settled(gateway, 1)
        async with running(settings, provider()) as gateway:
            fake.push_update(first)  # Telegram redelivering an unconfirmed update
            fake.user_message(ALICE, "remember that I like tea")
            await settled(gateway, 1)
            replay = await replay_of(gateway, f"telegram:{ALICE}")
        bodies = [r.body for r in srv.requests_for("anthropic")]
    said = [m["content"] for m in replay.messages
            if m["role"] == "user" and isinstance(m["content"], str)]
    assert said == ["hi, I'm Alice", "remember that I like tea"]
    assert len(bodies) == len(replay.calls) == 3
    assert [replay.request(turn) for turn in replay.calls] == bodies
    for n, body in enumerate(bodies, start=1):
        code, out = await asyncio.to_thread(replay_cli, tmp_path, replay.session_id,
                                            "--request", str(n), "--json")
        assert code == 0
        assert orjson.loads(out) == body
    assert fake.texts_to(ALICE) == ["Hello Alice.", "Noting that.\n\nTea it is."]
