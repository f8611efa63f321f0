"""What the platforms' requests may carry, against a real running gateway: access control
before content checks, platform ids checked at the adapter, reply bookkeeping that a bad update
or a cancelled turn cannot wedge, and @username allowlists that hold from the first message.

The gateway is the one of :mod:`tests.reliability.test_bad_input` (web, Slack Events API,
Telegram webhook, admin viewer, fake platforms), with settings varied per test.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from channels.telegram.adapter import TelegramChannel
from channels.telegram.convert import TOO_LONG_NOTICE, UNSUPPORTED_NOTICE
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer
from tests.reliability.support import session_files, wait_until
from tests.reliability.test_bad_input import (
    MAX_CHARS,
    TG_SECRET,
    TG_USER,
    Stack,
    metric,
    running_stack,
)

STRANGER = 5150
CLOSE_GRACE = 120.0
"""The Telegram channel's close grace in the shutdown tests: a close that waited it out would
log so (and take two minutes, inside the test's bound); a prompt one does neither. No clock
is read: the machine's speed cannot decide the verdict."""


def grace_ran_out(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The channel's "closing without them" warnings: its close grace ran out."""
    return [r.getMessage() for r in caplog.records if "close grace" in r.getMessage()]


async def webhook(stack: Stack, update: dict[str, Any]) -> int:
    assert stack.telegram is not None
    stack.telegram.pending_updates.clear()
    status, _ = await stack.telegram.deliver_webhook(stack.base + "/telegram/webhook", update,
                                                     secret=TG_SECRET)
    return status


def telegram_of(stack: Stack) -> TelegramChannel:
    [channel] = [c for c in stack.gateway.channels if isinstance(c, TelegramChannel)]
    return channel


def location(fake: FakeTelegramServer, user: int) -> dict[str, Any]:
    """A DM holding a location: a message kind the gateway does not read."""
    update = fake.user_message(user, "placeholder")
    del update["message"]["text"]
    update["message"]["location"] = {"latitude": 52.0, "longitude": 4.0}
    return update


# -- Telegram: access control before content checks -----------------------------------------------


@pytest.mark.parametrize("pairing", [False, True])
async def test_strangers_hear_nothing_about_content_only_allowed_people_do(
    tmp_path: Path, pairing: bool
) -> None:
    """A too-long text and a location from a stranger: with pairing off they get no answer at
    all, with pairing on only the pairing reply (once: one per stranger per window); the allowed
    person gets both content notices. Nothing is recorded."""
    async with running_stack(tmp_path, pairing=pairing) as stack:
        fake = stack.telegram
        assert fake is not None
        for user in (STRANGER, TG_USER):
            assert await webhook(stack, fake.user_message(user, "x" * (MAX_CHARS + 1))) == 200
            assert await webhook(stack, location(fake, user)) == 200
        await wait_until(lambda: len(fake.texts_to(TG_USER)) == 2)
        # Each webhook call returned once access control had decided (and any notice was
        # sent): all four refusals counted means the stranger's updates are through it.
        await wait_until(lambda: metric(stack.gateway, "gateway_refused_total",
                                        channel="telegram") == 4)
        if pairing:
            await wait_until(lambda: len(fake.texts_to(STRANGER)) >= 1)
        to_stranger = fake.texts_to(STRANGER)
        to_allowed = fake.texts_to(TG_USER)
    assert to_allowed == [TOO_LONG_NOTICE.format(length=MAX_CHARS + 1, limit=MAX_CHARS),
                          UNSUPPORTED_NOTICE]
    if pairing:
        assert len(to_stranger) == 1
        assert "gateway pairing approve" in to_stranger[0]
    else:
        assert to_stranger == []
    assert session_files(stack.data_dir) == []


# -- platform ids and reply bookkeeping --------------------------------------------------------


async def test_a_telegram_update_with_a_non_integer_chat_id_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An update whose chat id is not an integer (it needs the webhook secret) is dropped before
    anything is recorded, counted, and leaves no open reply behind: shutdown is not held up
    for the channel's close grace (it would say so when it runs out)."""
    async with running_stack(tmp_path, shutdown_grace=CLOSE_GRACE) as stack:
        update = stack.telegram.user_message(TG_USER, "hello")
        update["message"]["chat"]["id"] = "not-a-number"
        assert await webhook(stack, update) == 200
        assert metric(stack.gateway, "gateway_channel_errors_total", kind="bad_id") == 1
        assert telegram_of(stack).pending_replies == 0
        assert session_files(stack.data_dir) == []
        await stack.gateway.aclose()
    assert grace_ran_out(caplog) == []


async def test_cancelled_queued_turns_do_not_hold_up_shutdown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Turns still queued when the shutdown grace runs out are cancelled; their reply sinks were
    opened but never written, so the Telegram channel closes at once (not after its close
    grace, which would say so when it runs out)."""
    async with running_stack(tmp_path, shutdown_grace=0.3) as stack:
        channel = telegram_of(stack)
        channel.options = dataclasses.replace(channel.options, close_grace=CLOSE_GRACE)
        provider = stack.gateway.provider
        assert isinstance(provider, ScriptedProvider)
        provider.delay = 30.0  # the first turn runs past the grace; the others wait behind it
        for n in range(3):
            assert await webhook(stack, stack.telegram.user_message(TG_USER, f"m{n}")) == 200
        await wait_until(lambda: metric(stack.gateway, "gateway_inbound_total") == 3)
        assert channel.pending_replies == 0  # nothing is being written yet
        await stack.gateway.aclose()
    assert grace_ran_out(caplog) == []


async def test_slack_ids_with_a_newline_are_dropped_not_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A signed Slack event whose channel, ts or user id holds a newline is acknowledged,
    counted and dropped: nothing recorded, and no log line is split by it."""
    caplog.set_level(logging.DEBUG, logger="channels")
    async with running_stack(tmp_path) as stack:
        statuses = []
        for field, value in (("channel", "D1\nFORGED line"), ("ts", "1.2\nx"),
                             ("user", "U1\nx"), ("thread_ts", "1.1\nx")):
            envelope = stack.slack.dm_event("U1", "hello")
            envelope["event"][field] = value
            statuses.append(await stack.slack_event(envelope))
        await stack.slack_marker()  # U1's DM, after them: answered, and every turn ended
        conversations = stack.user_texts()
    assert conversations == {f"slack:{stack.slack.im_channel_for('U1')}": ["marker"]}
    assert statuses == [200] * 4
    assert metric(stack.gateway, "gateway_channel_errors_total", kind="bad_id") == 4
    assert [r.getMessage() for r in caplog.records if "\n" in r.getMessage()] == []


# -- Slack: @username allowlists hold from the first message ------------------------------------


async def test_an_allowed_username_is_answered_on_the_first_message(tmp_path: Path) -> None:
    """SLACK_ALLOWED_USERS=@ada: Ada's first DM after a start is answered (her @username is
    looked up before access control decides), not met with a pairing code."""
    async with running_stack(tmp_path, slack_allowed_users="@ada") as stack:
        stack.slack.add_user("U0ADA", name="ada")
        envelope = stack.slack.dm_event("U0ADA", "first message")
        assert await stack.slack_event(envelope) == 200
        await wait_until(lambda: stack.slack_turns() == 1)
        texts = [post.text or "" for post in stack.slack.posts()]
    assert not any("gateway pairing approve" in text for text in texts)
    assert metric(stack.gateway, "gateway_refused_total", channel="slack") == 0
    [path] = session_files(stack.data_dir)
    assert orjson.loads(path.read_bytes().split(b"\n")[1])["message"]["content"] \
        == "first message"
