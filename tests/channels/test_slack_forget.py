"""``/gateway forget`` over Slack (real slack-bolt against the fake Slack): a person erases
their memory and DM sessions in their workspace; the same user id in a channel keeps its log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from providers.offline import OfflineProvider
from tests.channels.test_chat_commands import bot_texts, slash
from tests.channels.test_slack_gateway import TEAM, events_url, slack_settings, wait_until
from tests.channels.test_slack_gateway import running as slack_running
from tests.fakes.slack_api import FakeSlackServer


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer() as server:
        yield server


async def test_slash_forget_in_a_dm_asks_then_erases(slack: FakeSlackServer,
                                                     tmp_path: Path) -> None:
    """/gateway forget asks; /gateway forget confirm erases U1's DM memory and session; the
    channel thread U1 spoke in keeps its session and its memory."""
    dm = slack.im_channel_for("U1")
    async with slack_running(slack_settings(slack, tmp_path), OfflineProvider()) as gateway:
        url = events_url(gateway)
        await slack.deliver_event(url, slack.dm_event("U1", "remember that I like tea",
                                                      channel=dm))
        mention = slack.mention_events("U1", "remember that we ship")[0]
        await slack.deliver_event(url, mention)
        await wait_until(lambda: len(bot_texts(slack, dm)) == 1
                         and len(bot_texts(slack, "C0FAKEGEN")) == 1)
        assert await slash(slack, url, "forget", channel=dm) == (200, "")
        await wait_until(lambda: len(bot_texts(slack, dm)) == 2)
        assert await slash(slack, url, "forget confirm", channel=dm) == (200, "")
        await wait_until(lambda: len(bot_texts(slack, dm)) == 3)
        await gateway.router.drain(2)
        infos = await gateway.store.list_sessions(TEAM)
    _, ask, done = bot_texts(slack, dm)
    assert ask.startswith("This erases, for good,")
    assert done.startswith("Done: I erased what I remembered about you (2 files) and 1 ")
    assert [i.conversation for i in infos] == [f"slack:C0FAKEGEN:{mention['event']['ts']}"]
    memory = tmp_path / "persona" / "memory" / TEAM / "slack"
    assert not (memory / "people" / "U1").exists()
    assert (memory / "chats" / "C0FAKEGEN" / "MEMORY.md").read_text() == "we ship\n"
