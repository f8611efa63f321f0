"""``/forget`` over Telegram (real PTB against the fake Bot API): a person erases themselves
from a private chat; in a group the command erases nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.erasure.forget import GROUP_REPLY
from providers.offline import OfflineProvider
from tests.channels.test_telegram_harness import (
    ALICE,
    BOB,
    running,
    sessions,
    settled,
    telegram_settings,
)
from tests.fakes.telegram_api import FakeTelegramServer

GROUP = -100777


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


async def reply_to(fake: FakeTelegramServer, chat: int, starts: str) -> str:
    """The text of the first message the bot sent to ``chat`` that starts with ``starts``."""
    calls = await fake.wait_for_sent(
        lambda c: c.method == "sendMessage" and c.chat_id == chat and c.ok
        and (c.text or "").startswith(starts))
    return calls[0].text or ""


async def test_forget_in_a_private_chat_erases_that_person(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """/forget asks, /forget confirm erases Alice's DM sessions and memory; Bob keeps his,
    and /forget@bot in a group answers without erasing anything."""
    settings = telegram_settings(fake, tmp_path, TELEGRAM_GROUP_MODE="all")
    async with running(settings, OfflineProvider()) as gateway:
        fake.user_message(ALICE, "remember that I like tea", user_id=ALICE)
        fake.user_message(BOB, "remember that I like coffee", user_id=BOB)
        fake.user_message(GROUP, "remember that the demo is friday", user_id=ALICE,
                          chat_type="supergroup")
        await settled(gateway, 3)
        fake.user_message(ALICE, "/forget", user_id=ALICE)
        assert "/forget confirm" in await reply_to(fake, ALICE, "This erases")
        fake.user_message(GROUP, "/forget@fake_test_bot confirm", user_id=ALICE,
                          chat_type="supergroup")
        assert await reply_to(fake, GROUP, "/forget works") == GROUP_REPLY
        fake.user_message(ALICE, "/forget confirm", user_id=ALICE)
        done = await reply_to(fake, ALICE, "Done")
        assert done.startswith("Done: I erased what I remembered about you (2 files) and 1 ")
        assert [c for c, _ in await sessions(gateway)] == [f"telegram:{GROUP}",
                                                           f"telegram:{BOB}"]
    memory = tmp_path / "persona" / "memory" / "default" / "telegram"
    assert not (memory / "people" / str(ALICE)).exists()
    assert (memory / "people" / str(BOB) / "MEMORY.md").read_text() == "I like coffee\n"
    assert len(list((memory / "chats").iterdir())) == 1  # the group keeps its memory


async def test_forget_is_in_the_private_chat_menu_only(
    fake: FakeTelegramServer, tmp_path: Path
) -> None:
    """The bot's menu in private chats lists /forget; the default menu (what groups show)
    does not, as /forget does nothing in a group; every other listed command is in both."""
    async with running(telegram_settings(fake, tmp_path)):
        pass
    default = [c["command"] for c in fake.commands[('{"type":"default"}', "")]]
    private = [c["command"] for c in fake.commands[('{"type":"all_private_chats"}', "")]]
    assert "forget" in private
    assert "forget" not in default
    assert [c for c in private if c != "forget"] == default
