"""Telegram and Slack reconcile an answer with the platform instead of sending it again: the
sinks against the local fakes, driven by python-telegram-bot and slack_sdk, with a placement
that records what the core would note.

Telegram: every message of an answer is a placeholder first, noted, then edited (so a stray
copy can only be a placeholder); a noted message is edited, never sent again; a deleted one
is replaced. Slack: every message carries the item id in its metadata and is noted once
posted; a taken-over item with nothing noted finds its own message in the thread by that
metadata and edits it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.convert import META_REPLY_THREAD, META_TS
from channels.slack.sink import EVENT_TYPE, SlackCalls, SlackTarget
from channels.streaming import EditStreamer
from channels.telegram.adapter import build_bot
from channels.telegram.render import render_chunks
from channels.telegram.sink import PLACEHOLDER, BotApi, TelegramTarget
from gateway.edge.channel import Placed
from gateway.edge.messages import ConversationKey, Inbound, Sender
from gateway.edge.metrics import Metrics
from tests.channels.test_slack_gateway import (
    events_url,
    running,
    slack_settings,
    thread_texts,
    turns,
    wait_until,
)
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer

ALICE = 1001
USER = "U0ALICE"


@dataclass
class Noting:
    """A :class:`gateway.edge.channel.Placement` that records the notes (and, with
    ``events``, where they fell among the platform calls)."""

    item: str = "0123456789abcdef"
    known: tuple[Placed, ...] = ()
    resumed: bool = False
    notes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    calls_then: list[int] = field(default_factory=list)
    count_calls: Any = None

    waits: list[bool] = field(default_factory=list)

    async def note(self, part: int, ref: Mapping[str, Any], *, wait: bool = True) -> bool:
        self.notes.append((part, dict(ref)))
        self.waits.append(wait)
        if self.count_calls is not None:
            self.calls_then.append(self.count_calls())
        return True


# -- Telegram --------------------------------------------------------------------------------


@pytest.fixture
async def telegram() -> AsyncIterator[tuple[FakeTelegramServer, BotApi]]:
    async with FakeTelegramServer() as fake:
        fake.add_chat(ALICE)
        bot = build_bot(fake.token, fake.base_url, rate_limit=False)
        async with bot:
            yield fake, BotApi(bot, Metrics(), fake.token, retry_429=True)


def telegram_sink(api: BotApi, placement: Noting) -> EditStreamer:
    sink = EditStreamer(TelegramTarget(api, ALICE), min_interval=0.0, typing_delay=60.0)
    sink.place(placement)
    return sink


def replies(fake: FakeTelegramServer) -> list[tuple[str, str | None]]:
    return [(c.method, c.text) for c in fake.sent if c.method != "getMe"]


async def test_telegram_answer_text_goes_only_into_a_noted_placeholder(
    telegram: tuple[FakeTelegramServer, BotApi],
) -> None:
    """A new answer: a placeholder is sent, its id noted before anything else reaches
    Telegram, then it is edited into the final text."""
    fake, api = telegram
    placement = Noting(count_calls=lambda: len(fake.sent))
    await telegram_sink(api, placement).finish("Hello **there**")
    [message] = fake.messages_to(ALICE)
    assert replies(fake) == [("sendMessage", PLACEHOLDER),
                             ("editMessageText", "Hello <b>there</b>")]
    assert placement.notes == [(0, {"chat": ALICE, "message": message["message_id"]})]
    assert placement.calls_then == [2]  # getMe and the placeholder: nothing after it yet
    assert message["text"] == "Hello there"


async def test_telegram_noted_message_is_edited_never_sent_again(
    telegram: tuple[FakeTelegramServer, BotApi],
) -> None:
    """A taken-over answer whose message was noted (it holds the placeholder, or the
    answer already): it is edited to the recorded text; nothing is sent or noted again."""
    fake, api = telegram
    sent = await api.bot.send_message(ALICE, PLACEHOLDER)
    placement = Noting(known=(Placed(0, {"chat": ALICE, "message": sent.message_id}),),
                       resumed=True)
    await telegram_sink(api, placement).finish("the recorded answer")
    await telegram_sink(api, placement).finish("the recorded answer")  # once more: no change
    assert fake.texts_to(ALICE) == ["the recorded answer"]
    assert [m for m, _ in replies(fake)] == ["sendMessage", "editMessageText", "editMessageText"]
    assert placement.notes == []


async def test_telegram_noted_message_deleted_meanwhile_is_replaced(
    telegram: tuple[FakeTelegramServer, BotApi],
) -> None:
    """The noted message is gone (deleted): a new placeholder is noted and edited."""
    fake, api = telegram
    sent = await api.bot.send_message(ALICE, PLACEHOLDER)
    await api.bot.delete_message(ALICE, sent.message_id)
    placement = Noting(known=(Placed(0, {"chat": ALICE, "message": sent.message_id}),),
                       resumed=True)
    await telegram_sink(api, placement).finish("the answer")
    [message] = fake.messages_to(ALICE)
    assert message["text"] == "the answer"
    assert placement.notes == [(0, {"chat": ALICE, "message": message["message_id"]})]


async def test_telegram_long_answer_notes_every_part_and_edits_those_known(
    telegram: tuple[FakeTelegramServer, BotApi],
) -> None:
    """A three-chunk answer whose first two messages were noted by an earlier run: those two
    are edited, only the third is opened (a placeholder, noted as part 2)."""
    fake, api = telegram
    text = "\n\n".join(f"paragraph {i} " + "x" * 3000 for i in range(3))
    chunks = render_chunks(text)
    assert len(chunks) == 3
    ids = [(await api.bot.send_message(ALICE, PLACEHOLDER)).message_id for _ in range(2)]
    placement = Noting(known=tuple(Placed(i, {"chat": ALICE, "message": m})
                                   for i, m in enumerate(ids)), resumed=True)
    await telegram_sink(api, placement).finish(text)
    assert fake.texts_to(ALICE) == [c.plain for c in chunks]
    third = fake.messages_to(ALICE)[2]["message_id"]
    assert placement.notes == [(2, {"chat": ALICE, "message": third})]


async def test_telegram_preview_opens_the_noted_message_the_final_fills(
    telegram: tuple[FakeTelegramServer, BotApi],
) -> None:
    """Streamed: the preview goes into the noted placeholder, and the final into the same
    message; one message, noted once."""
    fake, api = telegram
    placement = Noting()
    sink = telegram_sink(api, placement)
    await sink.delta("a partial ")
    await sink.finish("a partial answer")
    assert [m for m, _ in replies(fake)] == ["sendMessage", "editMessageText",
                                             "editMessageText"]
    assert fake.texts_to(ALICE) == ["a partial answer"]
    assert len(placement.notes) == 1


# -- Slack -----------------------------------------------------------------------------------


@pytest.fixture
async def slack() -> AsyncIterator[tuple[FakeSlackServer, SlackCalls]]:
    async with FakeSlackServer() as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_base_url)
        yield fake, SlackCalls(client, Metrics())


def slack_inbound(fake: FakeSlackServer) -> Inbound:
    event = fake.dm_event(USER, "hi")["event"]
    return Inbound(ConversationKey("slack", event["channel"], tenant=fake.team_id),
                   Sender(USER), "hi",
                   meta={META_TS: event["ts"], META_REPLY_THREAD: event["ts"]})


def slack_sink(calls: SlackCalls, inbound: Inbound, placement: Noting) -> EditStreamer:
    sink = EditStreamer(SlackTarget(calls, inbound), min_interval=0.0, typing_delay=60.0)
    sink.place(placement)
    return sink


def bot_posts(fake: FakeSlackServer) -> list[dict[str, Any]]:
    return [m for m in fake.messages.values() if m.get("bot_id") == fake.bot_id]


async def test_slack_answer_carries_its_item_and_is_noted(
    slack: tuple[FakeSlackServer, SlackCalls],
) -> None:
    """A new answer is posted with the item id in its metadata and its ts noted."""
    fake, calls = slack
    inbound = slack_inbound(fake)
    placement = Noting()
    await slack_sink(calls, inbound, placement).finish("the answer")
    [post] = bot_posts(fake)
    assert post["metadata"] == {"event_type": EVENT_TYPE,
                                "event_payload": {"item": placement.item, "part": 0}}
    assert placement.notes == [(0, {"channel": inbound.key.chat, "ts": post["ts"]})]
    assert [c.method for c in fake.calls] == ["chat.postMessage"]
    # Posted with its text and findable by its item: the turn does not wait for the note.
    assert placement.waits == [False]


async def test_slack_takeover_finds_its_unnoted_message_in_the_thread(
    slack: tuple[FakeSlackServer, SlackCalls],
) -> None:
    """A resumed item with nothing noted (the earlier run died between posting and noting):
    its message is found in the thread by its metadata and edited; nothing is posted."""
    fake, calls = slack
    inbound = slack_inbound(fake)
    first = Noting()
    await slack_sink(calls, inbound, first).finish("the answer")
    [post] = bot_posts(fake)
    fake.calls.clear()
    # Another item's answer in the same thread must not be taken for this one.
    other = Noting(item="fedcba9876543210")
    await slack_sink(calls, inbound, other).finish("another answer")
    again = Noting(resumed=True)
    await slack_sink(calls, inbound, again).finish("the answer, finished")
    methods = [c.method for c in fake.calls]
    assert methods == ["chat.postMessage", "conversations.replies", "chat.update"]
    assert fake.messages[(inbound.key.chat, post["ts"])]["text"] == "the answer, finished"
    assert len(bot_posts(fake)) == 2
    assert again.notes == []
    # The edit kept the metadata (an update without it leaves it intact).
    assert fake.messages[(inbound.key.chat, post["ts"])]["metadata"] == post["metadata"]


async def test_slack_noted_message_is_edited_without_a_search(
    slack: tuple[FakeSlackServer, SlackCalls],
) -> None:
    """A resumed item whose message was noted is edited; a resumed one with no message of
    its own in the thread is posted (after one look), noted like a new one."""
    fake, calls = slack
    inbound = slack_inbound(fake)
    first = Noting()
    await slack_sink(calls, inbound, first).finish("one")
    fake.calls.clear()
    known = Noting(known=tuple(Placed(p, r) for p, r in first.notes), resumed=True)
    await slack_sink(calls, inbound, known).finish("one, finished")
    fresh = Noting(item="1111111111111111", resumed=True)
    await slack_sink(calls, inbound, fresh).finish("two")
    assert [c.method for c in fake.calls] == [
        "chat.update", "conversations.replies", "chat.postMessage"]
    assert [m["text"] for m in bot_posts(fake)] == ["one, finished", "two"]
    assert len(fresh.notes) == 1


async def test_slack_answer_outside_a_thread_opens_as_a_placeholder(
    slack: tuple[FakeSlackServer, SlackCalls],
) -> None:
    """An answer with no thread to search (a scheduled turn's message at the top of a DM):
    it is posted as a placeholder, noted, then updated, so a kill before the note leaves
    "…", never a complete answer a restart would post again."""
    fake, calls = slack
    event = fake.dm_event(USER, "hi")["event"]
    scheduled = Inbound(ConversationKey("slack", event["channel"], tenant=fake.team_id),
                        Sender(USER), "scheduled: remind")
    placement = Noting()
    await slack_sink(calls, scheduled, placement).finish("the reminder")
    assert [(c.method, c.params.get("text")) for c in fake.calls] == [
        ("chat.postMessage", "…"), ("chat.update", "the reminder")]
    [post] = bot_posts(fake)
    assert placement.notes == [(0, {"channel": event["channel"], "ts": post["ts"]})]
    # A placeholder's note is in the log before the text goes in.
    assert placement.waits == [True]
    assert post["text"] == "the reminder"
    assert "thread_ts" not in post or post["thread_ts"] is None


async def test_slack_history_methods_follow_the_api(
    slack: tuple[FakeSlackServer, SlackCalls],
) -> None:
    """The fake's conversations.history and conversations.replies: newest-first top-level
    messages and parent-first threads, ``oldest`` exclusive, pages by cursor, metadata only
    with ``include_all_metadata``, errors for unknown channels and threads."""
    fake, calls = slack
    client = calls.client
    inbound = slack_inbound(fake)
    channel, parent = inbound.key.chat, inbound.meta[META_TS]
    for i in range(3):
        await client.chat_postMessage(channel=channel, thread_ts=parent, text=f"r{i}",
                                      metadata={"event_type": "t", "event_payload": {"i": i}})
    top = await client.chat_postMessage(channel=channel, text="top")
    history = await client.conversations_history(channel=channel)
    assert [m["text"] for m in history["messages"]] == ["top", "hi"]
    thread = await client.conversations_replies(channel=channel, ts=parent, limit=2)
    assert [m["text"] for m in thread["messages"]] == ["hi", "r0"]
    assert thread["has_more"] is True
    assert all("metadata" not in m for m in thread["messages"])
    rest = await client.conversations_replies(
        channel=channel, ts=parent, cursor=thread["response_metadata"]["next_cursor"],
        include_all_metadata=True)
    assert [(m["text"], m["metadata"]["event_payload"]) for m in rest["messages"]] == [
        ("r1", {"i": 1}), ("r2", {"i": 2})]
    after = await client.conversations_replies(channel=channel, ts=parent,
                                               oldest=rest["messages"][0]["ts"])
    assert [m["text"] for m in after["messages"]] == ["hi", "r2"]
    assert top["ts"] not in [m["ts"] for m in after["messages"]]
    for method, params, error in (
            ("conversations.replies", {"channel": channel, "ts": "1.0"}, "thread_not_found"),
            ("conversations.history", {"channel": "C0NOSUCH"}, "channel_not_found")):
        with pytest.raises(SlackApiError) as refused:
            await client.api_call(method, http_verb="GET", params=params)
        assert refused.value.response["error"] == error


async def test_slack_without_history_scopes_opens_answers_as_placeholders(
    tmp_path: Path,
) -> None:
    """An app that may not read its threads (no ``*:history`` scope, seen in auth.test's
    ``x-oauth-scopes``) could not find an unnoted answer again: its answers open as a
    placeholder, noted, then updated, as Telegram's do."""
    provider = ScriptedProvider()
    provider.script("the answer")
    async with FakeSlackServer() as slack:
        slack.scopes.discard("im:history")
        async with running(slack_settings(slack, tmp_path), provider) as gateway:
            envelope = slack.dm_event("U1", "hello")
            await slack.deliver_event(events_url(gateway), envelope, timeout=10)
            await wait_until(lambda: turns(gateway) == 1)
    writes = [(c.method, c.params.get("text")) for c in slack.calls
              if c.method in ("chat.postMessage", "chat.update")]
    assert writes == [("chat.postMessage", "…"), ("chat.update", "the answer")]
    event = envelope["event"]
    assert thread_texts(slack, event["channel"], event["ts"]) == ["the answer"]
