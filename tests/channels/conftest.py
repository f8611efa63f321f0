"""Fixtures shared by the channel tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.convert import META_REPLY_THREAD, META_TS
from channels.slack.sink import SlackCalls
from gateway.edge.messages import ConversationKey, Inbound, Sender
from gateway.edge.metrics import Metrics
from tests.fakes.slack_api import FakeSlackServer

USER = "U0ALICE"


@pytest.fixture
async def slack() -> AsyncIterator[tuple[FakeSlackServer, SlackCalls, Inbound]]:
    """A fake Slack, our Web API calls against it, and a DM from :data:`USER` to answer."""
    async with FakeSlackServer() as fake:
        event = fake.dm_event(USER, "a question")["event"]
        inbound = Inbound(key=ConversationKey("slack", event["channel"]), sender=Sender(USER),
                          text="a question", meta={META_TS: event["ts"],
                                                   META_REPLY_THREAD: event["ts"]})
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_base_url,
                                retry_handlers=[])
        yield fake, SlackCalls(client, Metrics()), inbound
