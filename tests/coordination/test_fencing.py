"""Fencing: a worker whose lease lapsed cannot write to the session once another took over."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from coordination.keys import Keys
from gateway.delivery.registry import ConversationRegistry
from gateway.edge.coordination import LeaseLostError
from gateway.edge.errors import NotRecordedError
from gateway.edge.messages import ChannelContext, ConversationKey
from gateway.edge.metrics import Metrics
from sessions import entries
from sessions.errors import StaleWriterError
from sessions.postgres.store import PostgresSessionStore
from tests.coordination.harness import (
    coordinator,
    item,
    lapse,
    log_of,
    transcript,
    wait_until,
    worker,
)
from tests.fakes.providers import content_text
from tests.fakes.scripted_provider import ScriptedProvider

pytestmark = pytest.mark.services

KEY = ConversationKey("memory", "c")
CONTEXT = ChannelContext("memory", "private", "u")


async def test_stale_worker_gets_stale_writer_error_and_writes_nothing(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore
) -> None:
    """A stale worker's append after a takeover raises StaleWriterError and lands nothing."""
    # A's lease lasts until the test lets it lapse (no renewal: nothing holds it).
    async with coordinator(prefix, pg_store, ttl=60) as a, coordinator(prefix, pg_store) as b:
        first = item("c", "from a")
        await a.conversations.enter(first)
        claim_a = await a.conversations.keep(first)
        assert claim_a is not None
        claim_a.token = await a.conversations.inbox.next_fence()  # as holding() takes it
        registry_a = ConversationRegistry(pg_store, Metrics())
        conv_a = await registry_a.get(KEY, CONTEXT, fence=claim_a.token)
        await conv_a.receive({"role": "user", "content": "from a"}, {"sender": "u"})
        # A never renews (a long GC pause, a frozen VM): the lease lapses, B adopts.
        await lapse(redis, Keys(prefix).lease(claim_a.key))
        [claim_b] = await b.conversations.sweep()
        claim_b.token = await b.conversations.inbox.next_fence()
        assert claim_b.token > claim_a.token
        assert claim_b.token > claim_a.token
        registry_b = ConversationRegistry(pg_store, Metrics())
        conv_b = await registry_b.get(KEY, CONTEXT, fence=claim_b.token)
        assert [m["content"] for m in conv_b.messages] == ["from a"]
        with pytest.raises(StaleWriterError) as stale:
            await conv_a.recorder.writer.append(
                [entries.message({"role": "assistant", "content": "late answer from a"})])
        assert (stale.value.token, stale.value.current) == (claim_a.token, claim_b.token)
        await conv_b.receive({"role": "user", "content": "from b"}, {"sender": "u"})
        await registry_a.aclose()
        await registry_b.aclose()
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "from a"), ("user", "from b")]


async def test_worker_that_loses_its_lease_mid_turn_stops_and_the_turn_is_finished_once(
    prefix: str, redis: aioredis.Redis, pg_store: PostgresSessionStore, tmp_path: Path
) -> None:
    """A holder cut off mid-turn stops; the heir finishes the recorded message, answering once."""
    slow = ScriptedProvider(delay=30.0)
    fast = ScriptedProvider()
    fast.script("the answer")
    async with worker(prefix, pg_store, slow, tmp_path / "p", ttl=1.5) as a:
        await a.channel.say("c", "question")
        await wait_until(lambda: bool(slow.bodies))  # A recorded it and called the provider
        # Another worker holds the lease for a moment (as if A's had lapsed and been taken).
        await redis.set(Keys(prefix).lease(KEY), "another-worker", px=1500)
        await wait_until(lambda: a.router.serving == 0, 5)  # A's renewal notices: cut off
    async with worker(prefix, pg_store, fast, tmp_path / "p", ttl=1.5) as b:
        await b.channel.wait_replies(1, timeout=10)
        assert b.channel.replies == [("c", "finish", "the answer")]
    assert a.channel.replies == []
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "question"), ("assistant", "the answer")]
    assert len(fast.bodies) == 1
    assert [(m["role"], content_text(m["content"])) for m in fast.bodies[0]["messages"]] == [
        ("user", "question")]
    assert [turn.assistant for turn in replay.calls] == [None, 1]  # A's call, then B's


async def test_lease_lost_error_is_a_plain_exception() -> None:
    """LeaseLostError is an Exception the router can catch (never a cancellation)."""
    assert issubclass(LeaseLostError, Exception)


async def test_a_writer_fenced_off_is_read_again_not_refenced(
    pg_store: PostgresSessionStore,
) -> None:
    """A worker whose append was refused as stale, taking the conversation back, reads the log
    again: its writer counted the refused entries, and when the other holder wrote as many,
    the sequence numbers agree although the copy in memory is not the log."""
    tokens = [await pg_store.next_fence() for _ in range(3)]
    registry_a = ConversationRegistry(pg_store, Metrics())
    registry_b = ConversationRegistry(pg_store, Metrics())
    conv_a = await registry_a.get(KEY, CONTEXT, fence=tokens[0])
    await conv_a.receive({"role": "user", "content": "from a"}, {"sender": "u"})
    conv_b = await registry_b.get(KEY, CONTEXT, fence=tokens[1])
    await conv_b.receive({"role": "user", "content": "from b"}, {"sender": "u"})
    with pytest.raises(NotRecordedError):
        await conv_a.receive({"role": "user", "content": "late from a"}, {"sender": "u"})
    again = await registry_a.get(KEY, CONTEXT, fence=tokens[2])
    assert [m["content"] for m in again.messages] == ["from a", "from b"]
    await registry_a.aclose()
    await registry_b.aclose()
