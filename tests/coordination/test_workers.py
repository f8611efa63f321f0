"""Several workers in one process, sharing Redis and PostgreSQL: ordering across workers,
replies relayed to the receiving worker, shared dedup, /new, and sessions from before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.edge.channel import Accepted
from gateway.edge.messages import ConversationKey, Inbound, Sender
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from sessions import entries
from sessions.postgres.inbox import PostgresInbox
from sessions.postgres.store import PostgresSessionStore
from sessions.replay import Replay, replay_bytes
from tests.coordination.harness import coordinator, item, log_of, transcript, wait_until, worker
from tests.fakes.scripted_provider import ScriptedProvider

pytestmark = pytest.mark.services


class EchoProvider(ScriptedProvider):
    """Answers ``re:<last user text>`` after a short delay (so messages queue up)."""

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        await asyncio.sleep(self.delay)
        last = request.messages[-1]["content"]
        text = f"re:{last}"
        if on_text is not None:
            await on_text(text)
        return ProviderResponse(message={"role": "assistant",
                                         "content": [{"type": "text", "text": text}]},
                                stop_reason="end_turn")


class RecordingSink:
    """A request's own sink (as the web channel's): what reached it, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.done = asyncio.Event()

    async def typing(self) -> None:
        self.events.append(("typing", ""))

    async def delta(self, text: str) -> None:
        self.events.append(("delta", text))

    async def finish(self, text: str) -> None:
        self.events.append(("finish", text))
        self.done.set()

    async def fail(self, text: str) -> None:
        self.events.append(("fail", text))
        self.done.set()


def inbound(chat: str, text: str, platform_id: str | None = None) -> Inbound:
    return Inbound(ConversationKey("memory", chat), Sender("u", "U"), text,
                   platform_id=platform_id)


async def test_messages_to_one_conversation_through_two_workers_keep_order(
    prefix: str, pg_store: PostgresSessionStore, tmp_path: Path
) -> None:
    """Messages alternating between two workers are answered once, in order, to their sinks."""
    async with worker(prefix, pg_store, EchoProvider(delay=0.02), tmp_path / "p") as a, \
            worker(prefix, pg_store, EchoProvider(delay=0.02), tmp_path / "p") as b:
        sinks = []
        accepted: list[Accepted] = []
        for n in range(12):
            sink = RecordingSink()
            sinks.append(sink)
            target = (a, b)[n % 2]
            accepted.append(await target.router.deliver(inbound("c", f"m{n}"), sink))
        async with asyncio.timeout(10):
            for sink in sinks:
                await sink.done.wait()
    finals = [[e for e in sink.events if e[0] in ("finish", "fail")] for sink in sinks]
    assert finals == [[("finish", f"re:m{n}")] for n in range(12)]
    replay = await log_of(pg_store, "c")
    expected = []
    for n in range(12):
        expected += [("user", f"m{n}"), ("assistant", f"re:m{n}")]
    assert transcript(replay) == expected
    assert {await acc.session(5) for acc in accepted} == {replay.session_id}
    assert [turn.assistant for turn in replay.calls] == list(range(1, 24, 2))


async def test_platform_ids_are_deduplicated_across_workers(
    prefix: str, redis: aioredis.Redis, pg_store: PostgresSessionStore, tmp_path: Path
) -> None:
    """One delivery reaching two workers is answered once: its id is refused by the inbox in
    PostgreSQL (so Redis losing its keys cannot let it through again)."""
    async with worker(prefix, pg_store, EchoProvider(), tmp_path / "p") as a, \
            worker(prefix, pg_store, EchoProvider(), tmp_path / "p") as b:
        first = await a.router.deliver(inbound("c", "hi", "T1:C1:100.1"))
        keys = [k async for k in redis.scan_iter(match=f"{prefix}*")]
        if keys:
            await redis.delete(*keys)  # Redis forgets everything in between
        second = await b.router.deliver(inbound("c", "hi", "T1:C1:100.1"))
        # A later message in the conversation, answered: the conversation is served in order,
        # so a second answer to "hi" would have come before it.
        await b.router.deliver(inbound("c", "marker", "T1:C1:100.2"))
        await wait_until(lambda: ("c", "finish", "re:marker")
                         in a.channel.replies + b.channel.replies)
        replies = a.channel.replies + b.channel.replies
    assert (first.duplicate, second.duplicate) == (False, True)
    assert replies == [("c", "finish", "re:hi"), ("c", "finish", "re:marker")]


async def test_new_command_waits_for_queued_turns_and_rotates_once(
    prefix: str, pg_store: PostgresSessionStore, tmp_path: Path
) -> None:
    """/new sent to another worker while turns are queued starts the new session after them."""
    async with worker(prefix, pg_store, EchoProvider(delay=0.05), tmp_path / "p") as a, \
            worker(prefix, pg_store, EchoProvider(delay=0.05), tmp_path / "p") as b:
        await a.router.deliver(inbound("c", "one"))
        await a.router.deliver(inbound("c", "two"))
        await b.router.deliver(inbound("c", "/new"))
        await a.router.deliver(inbound("c", "three"))
        await wait_until(lambda: len(a.channel.replies) + len(b.channel.replies) >= 4)
        replies = sorted(a.channel.replies + b.channel.replies)
    sessions = await pg_store.list_sessions("default")
    assert len(sessions) == 2
    newest = await log_of(pg_store, "c")
    assert transcript(newest) == [("user", "three"), ("assistant", "re:three")]
    older = next(s.session_id for s in sessions if s.session_id != newest.session_id)
    assert [text for _, text in transcript(await _replay(pg_store, older))] == [
        "one", "re:one", "two", "re:two"]
    assert [r[2] for r in replies if r[2].startswith("Started")] == [
        f"Started a new conversation (session {newest.session_id})."]


async def test_session_from_before_sharing_is_taken_over(
    prefix: str, pg_store: PostgresSessionStore, tmp_path: Path
) -> None:
    """A session whose fence predates Redis is taken over by raising the lease's token."""
    writer = await pg_store.create(tenant="default", channel="memory", conversation="memory:c")
    await writer.append([entries.message({"role": "user", "content": "old"})])
    await writer.append([entries.message({"role": "assistant", "content": "old answer"})])
    for _ in range(4):  # four restarts of a single gateway: fence 5
        await (await pg_store.open("default", writer.session_id)).aclose()
    async with worker(prefix, pg_store, EchoProvider(), tmp_path / "p") as a:
        await a.router.deliver(inbound("c", "new"))
        await a.channel.wait_replies(1)
    replay = await log_of(pg_store, "c")
    assert replay.session_id == writer.session_id
    assert [text for _, text in transcript(replay)] == ["old", "old answer", "new", "re:new"]


async def _replay(store: PostgresSessionStore, session_id: str) -> Replay:
    return replay_bytes(await store.read_log("default", session_id))


async def test_a_withdrawn_item_stays_owed_and_its_redelivery_is_its_duplicate(
    prefix: str, pg_store: PostgresSessionStore
) -> None:
    """With several workers a received item is never taken back: withdrawing it leaves its
    inbox row owed (its conversation still has it to answer), and the platform's redelivery
    is recognised as its duplicate, not entered as a second message."""
    async with coordinator(prefix, pg_store) as coord:
        first = item("c", "hello")
        assert not (await coord.conversations.enter(first, "memory:c:m1")).duplicate
        await coord.conversations.withdraw(first)
        again = await coord.conversations.enter(item("c", "hello"), "memory:c:m1")
    assert (again.duplicate, again.original) == (True, first.id)
    inbox = PostgresInbox(pg_store)
    (owed,) = await inbox.owed_conversations()
    head = await inbox.head(*owed)
    assert head is not None
    assert head.item == first.id
