"""The chat commands, one table served the platforms' own ways: Telegram's command menu and
/start greeting, Slack's /gateway slash command, the web chat and the terminal."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.edge import commands
from tests.channels.test_slack_gateway import TEAM, events_url, slack_settings
from tests.channels.test_slack_gateway import running as slack_running
from tests.channels.test_telegram_harness import ALICE, running, telegram_settings, wait_until
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer

HELP_LINES = ["/new - start a new conversation (the agent forgets this chat's history)",
              "/help - show the commands",
              "/forget - erase what I remember about you and our direct chats (asks first)",
              "/usage - what you and this chat used today (tokens, cost, allowance)",
              "/reminders - this chat's reminders (cancel ID to cancel one; timezone ZONE "
              "for yours)"]


def test_the_table_parses_commands_and_nothing_else() -> None:
    """/new, /NEW@bot and /help with words are commands; text and unknown /words are not."""
    assert commands.parse("/new") is commands.NEW
    assert commands.parse("  /NEW@my_bot ") is commands.NEW
    assert commands.parse("/help me please") is commands.HELP
    assert commands.parse("/start") is commands.START
    assert [commands.parse(t) for t in ("new", "/newer", "/", "", "hello /new")] == [None] * 5
    assert commands.help_text().splitlines() == ["Commands:", *HELP_LINES]
    assert [c.name for c in commands.listed()] == ["new", "help", "forget", "usage",
                                                   "reminders"]


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


async def test_telegram_menu_start_and_help(telegram: FakeTelegramServer, tmp_path: Path) -> None:
    """At start the bot's menus are the table's listed commands (/forget in private chats
    only); /start greets with the help, /help lists the commands; neither reaches the model or
    opens a session."""
    provider = ScriptedProvider()
    async with running(telegram_settings(telegram, tmp_path), provider) as gateway:
        telegram.user_message(ALICE, "/start")
        await wait_until(lambda: len(telegram.texts_to(ALICE)) == 1)
        telegram.user_message(ALICE, "/help")
        await wait_until(lambda: len(telegram.texts_to(ALICE)) == 2)
        listed = await gateway.store.list_sessions(None)
    in_groups = [
        {"command": "new", "description": commands.NEW.summary},
        {"command": "help", "description": commands.HELP.summary},
        {"command": "usage", "description": commands.USAGE.summary},
        {"command": "reminders", "description": commands.REMINDERS.summary},
    ]
    in_private = [*in_groups[:2], {"command": "forget", "description": commands.FORGET.summary},
                  *in_groups[2:]]
    # /forget (direct messages only) is in the private chats' menu alone.
    assert telegram.commands == {('{"type":"default"}', ""): in_groups,
                                 ('{"type":"all_private_chats"}', ""): in_private}
    greeting, help_reply = telegram.texts_to(ALICE)
    assert greeting.startswith(commands.GREETING)
    assert greeting.splitlines()[-len(HELP_LINES):] == HELP_LINES
    assert help_reply.splitlines() == ["Commands:", *HELP_LINES]
    assert provider.bodies == []
    assert listed == []


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer() as server:
        yield server


async def slash(fake: FakeSlackServer, url: str, text: str, *, channel: str,
                channel_name: str = "directmessage", user: str = "U1") -> tuple[int, str]:
    """POST a signed /gateway slash-command payload, as Slack does."""
    body = urllib.parse.urlencode({
        "command": "/gateway", "text": text, "team_id": TEAM, "channel_id": channel,
        "channel_name": channel_name, "user_id": user, "trigger_id": f"t.{time.monotonic()}",
        "response_url": "http://127.0.0.1:9/unused",
    }).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded", **fake.sign(body)}
    async with aiohttp.ClientSession() as client, client.post(url, data=body,
                                                              headers=headers) as response:
        return response.status, await response.text()


def bot_texts(fake: FakeSlackServer, channel: str) -> list[str]:
    found = sorted((ts, m) for (c, ts), m in fake.messages.items()
                   if c == channel and m.get("bot_id") == fake.bot_id)
    return [m["text"] for _, m in found]


async def test_slack_slash_command(slack: FakeSlackServer, tmp_path: Path) -> None:
    """/gateway help answers the person at once with the Slack spelling; /gateway new in a DM
    starts a new session (the router's answer arrives as a message); in a channel it explains;
    an unknown word lists the commands."""
    provider = ScriptedProvider()
    provider.script("first answer")
    dm = slack.im_channel_for("U1")
    async with slack_running(slack_settings(slack, tmp_path), provider) as gateway:
        url = events_url(gateway)
        await slack.deliver_event(url, slack.dm_event("U1", "hello", channel=dm))
        await wait_until(lambda: len(bot_texts(slack, dm)) == 1)
        status, help_body = await slash(slack, url, "help", channel=dm)
        assert status == 200
        assert "/gateway new - start a new conversation" in help_body
        assert await slash(slack, url, "new", channel=dm) == (200, "")
        await wait_until(lambda: len(bot_texts(slack, dm)) == 2)
        _, in_channel = await slash(slack, url, "new", channel="C0FAKEGEN",
                                    channel_name="general")
        _, unknown = await slash(slack, url, "frobnicate", channel=dm)
        await gateway.router.drain(2)
        infos = await gateway.store.list_sessions(TEAM)
    first, started = bot_texts(slack, dm)
    assert first == "first answer"
    assert started.startswith("Started a new conversation (session ")
    assert "start a new thread" in in_channel
    assert "Unknown command 'frobnicate'" in unknown
    assert "/gateway help - show the commands" in unknown
    # The old session and the new one, empty until spoken to.
    assert sorted((i.conversation, i.first_user_text or "") for i in infos) == [
        (f"slack:{dm}", ""), (f"slack:{dm}", "hello")]


async def test_web_chat_serves_the_same_commands(tmp_path: Path) -> None:
    """POST /api/chat with /help answers the commands without a session."""
    from app.compose import build_gateway
    from tests.channels.test_web import settings as web_settings

    gateway = build_gateway(web_settings(tmp_path))
    await gateway.start()
    try:
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{gateway.bound_port}/api/chat"
            async with client.post(url, json={"conversation": "c", "text": "/help"}) as response:
                body = await response.json()
    finally:
        await gateway.aclose()
    assert body["reply"].splitlines() == ["Commands:", *HELP_LINES]
    assert "session" not in body  # nothing recorded, and a reply never names a null session
