"""An abandoned final reply (the worker lost the lease while its entries waited to be saved)
takes its streamed preview back: Telegram deleteMessage and Slack chat.delete against the
local fakes driven by python-telegram-bot and slack_sdk, and the web chat's retract event."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from channels.slack.sink import SlackCalls, SlackTarget
from channels.streaming import EditStreamer
from channels.telegram.adapter import build_bot
from channels.telegram.sink import BotApi, TelegramTarget
from channels.web.sink import WebSink
from gateway.delivery.answering import Answering
from gateway.edge.channel import ReplySink
from gateway.edge.coordination import LeaseLostError
from gateway.edge.messages import Inbound
from gateway.edge.metrics import Metrics
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer

ALICE = 1001
USER = "U0ALICE"


async def lease_lost() -> None:
    """The router's wait for the turn's entries, ended by the lease passing on."""
    raise LeaseLostError("lease on memory:c lapsed")


async def never_answered() -> None:
    raise AssertionError("an abandoned reply must not mark its item answered")


async def abandon_after_preview(sink: ReplySink, *deltas: str) -> None:
    """Stream ``deltas`` (a preview goes out), then try to finish while the lease is lost;
    the retraction runs in a task group as the router's would, and is awaited by its end."""
    async with asyncio.TaskGroup() as group:
        answering = Answering(sink, never_answered, lease_lost, group.create_task)
        await answering.typing()
        for text in deltas:
            await answering.delta(text)
        with pytest.raises(LeaseLostError):
            await answering.finish("the whole answer")


# -- Telegram --------------------------------------------------------------------------------


@pytest.fixture
async def telegram() -> AsyncIterator[tuple[FakeTelegramServer, BotApi]]:
    async with FakeTelegramServer() as fake:
        fake.add_chat(ALICE)
        bot = build_bot(fake.token, fake.base_url, rate_limit=False)
        async with bot:
            yield fake, BotApi(bot, Metrics(), fake.token, retry_429=True)


def telegram_sink(api: BotApi) -> EditStreamer:
    return EditStreamer(TelegramTarget(api, ALICE), min_interval=0.0, typing_delay=60.0)


async def test_telegram_preview_deleted_when_the_reply_is_abandoned(
    telegram: tuple[FakeTelegramServer, BotApi],
) -> None:
    """The preview message is deleted; no final text is sent (the new holder answers)."""
    fake, api = telegram
    await abandon_after_preview(telegram_sink(api), "a half ", "answer")
    assert [(c.method, c.error_code) for c in fake.sent if c.method != "getMe"] == [
        ("sendMessage", None), ("editMessageText", None), ("deleteMessage", None)]
    assert fake.texts_to(ALICE) == []


async def test_telegram_failed_delete_is_logged_once_and_not_raised(
    telegram: tuple[FakeTelegramServer, BotApi], caplog: pytest.LogCaptureFixture,
) -> None:
    """Telegram refuses the delete: one warning, counted, and the turn is not troubled."""
    fake, api = telegram
    fake.fail_next("deleteMessage", 400, "Bad Request: message can't be deleted")
    with caplog.at_level(logging.WARNING, logger="channels.telegram"):
        await abandon_after_preview(telegram_sink(api), "a half answer")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "deleteMessage (preview)" in warnings[0]
    assert fake.texts_to(ALICE) == ["a half answer"]
    assert metric(api.metrics, "gateway_channel_errors_total", channel="telegram",
                  kind="bad_request") == 1


# -- Slack -----------------------------------------------------------------------------------


def slack_sink(calls: SlackCalls, inbound: Inbound) -> EditStreamer:
    return EditStreamer(SlackTarget(calls, inbound), min_interval=0.0, typing_delay=0.0)


async def test_slack_preview_deleted_and_reaction_taken_back(
    slack: tuple[FakeSlackServer, SlackCalls, Inbound],
) -> None:
    """chat.delete removes the preview from the thread and the :eyes: reaction goes, so the
    next holder can add (and later remove) its own."""
    fake, calls, inbound = slack
    await abandon_after_preview(slack_sink(calls, inbound), "a half ", "answer")
    assert [(c.method, c.error) for c in fake.calls] == [
        ("reactions.add", None), ("chat.postMessage", None), ("chat.update", None),
        ("chat.delete", None), ("reactions.remove", None)]
    bot_messages = [m for m in fake.messages.values() if m.get("bot_id") == fake.bot_id]
    assert bot_messages == []
    assert not any(fake.reactions.values())


async def test_slack_failed_delete_is_logged_once_and_not_raised(
    slack: tuple[FakeSlackServer, SlackCalls, Inbound], caplog: pytest.LogCaptureFixture,
) -> None:
    """Slack refuses the delete: one warning naming the method and error code, counted."""
    fake, calls, inbound = slack
    fake.fail_next("chat.delete", "cant_delete_message")
    with caplog.at_level(logging.WARNING, logger="channels.slack"):
        await abandon_after_preview(slack_sink(calls, inbound), "a half answer")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["slack chat.delete failed: cant_delete_message"]
    assert [m["text"] for m in fake.messages.values() if m.get("bot_id") == fake.bot_id] == [
        "a half answer"]
    assert metric(calls.metrics, "gateway_channel_errors_total", channel="slack",
                  kind="cant_delete_message") == 1


# -- web and the seam ------------------------------------------------------------------------


async def test_web_stream_is_told_to_drop_the_abandoned_deltas() -> None:
    """The web sink queues ``retract`` (the page clears its bubble); a reply relayed from the
    next holder then streams afresh into the same request."""
    sink = WebSink(stream=True)
    await abandon_after_preview(sink, "a half ", "answer")
    await sink.delta("the new ")
    await sink.finish("the new answer")
    events = [sink.events.get_nowait() for _ in range(sink.events.qsize())]
    assert events == [("delta", "a half "), ("delta", "answer"), ("retract", ""),
                      ("delta", "the new "), ("done", "the new answer")]


async def test_a_final_reply_sent_is_never_retracted() -> None:
    """Once a final reply went out, abandon() does nothing (a lease lost later, while the
    item is being marked answered, must not delete a real answer)."""
    sink = WebSink(stream=True)
    spawned: list[Any] = []
    answering = Answering(sink, _nothing, _nothing, spawned.append)
    await answering.delta("x")
    await answering.finish("x")
    answering.abandon()
    assert spawned == []


async def _nothing() -> None:
    return None


def metric(metrics: Metrics, name: str, **labels: str) -> float:
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
