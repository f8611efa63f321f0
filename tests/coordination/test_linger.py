"""A lease kept a moment after a conversation's queue emptied (``GATEWAY_LEASE_LINGER``): the
next message is served under the same lease and fencing token, a message received by another
worker wakes the holder (a poke), a holder whose lease passed on meanwhile writes and answers
nothing, the wait ends by itself, a stopping worker does not wait it out, and conversations
whose leases are kept still close to keep the open ones within their memory bound."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from coordination.keys import Keys
from gateway.edge.coordination import Claim, ConversationQueue, QueueItem
from gateway.edge.messages import ConversationKey
from sessions.postgres.store import PostgresSessionStore
from tests.coordination.harness import Worker, log_of, transcript, wait_until, worker
from tests.fakes.providers import content_text
from tests.fakes.scripted_provider import ScriptedProvider

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]

KEY = ConversationKey("memory", "c")
LONG = 600.0
"""A linger no test waits out: an answer that comes sooner came through the wake-up."""


async def wait_gone(present: Callable[[], Awaitable[int]], timeout: float) -> None:  # noqa: ASYNC109
    """Poll until ``present()`` says 0 (a Redis key has no event to wait on)."""
    async with asyncio.timeout(timeout):
        while await present():  # noqa: ASYNC110 - see the docstring
            await asyncio.sleep(0.05)


def echo() -> ScriptedProvider:
    """A model that answers each message with its text."""
    return ScriptedProvider(
        responder=lambda request: content_text(request.messages[-1]["content"]))


def answers(*workers: Worker) -> list[str]:
    """The final replies every worker's channel sent, in the order they were sent."""
    return [text for w in workers for _, kind, text in w.channel.events if kind == "finish"]


async def answered(w: Worker, text: str, *others: Worker) -> None:
    await wait_until(lambda: text in answers(w, *others), 60)


async def session_fence(store: PostgresSessionStore) -> int:
    session = await store.latest_session("default", KEY.label())
    async with store.connection() as conn:
        return int(await conn.fetchval(
            f"SELECT fence FROM {store.quoted_schema}.sessions WHERE id = $1", session))


async def test_the_next_message_is_served_under_the_same_lease_and_token(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """Two messages one after the other: the second is answered by the holder that kept the
    lease, under the same claim (the lease's value) and the same fencing token (the
    session's), with no token drawn in between; the log holds both turns in order."""
    lease = Keys(prefix).lease(KEY)
    async with worker(prefix, pg_store, echo(), tmp_path / "p", ttl=30,
                      linger=LONG) as a:
        await a.channel.say("c", "first", platform_id="first")
        await answered(a, "first")
        mark, fence = await redis.get(lease), await session_fence(pg_store)
        tokens = await pg_store.next_fence()
        await a.channel.say("c", "second", platform_id="second")
        await answered(a, "second")
        assert (await redis.get(lease), await session_fence(pg_store)) == (mark, fence)
        assert await pg_store.next_fence() == tokens + 1  # none drawn by the second message
    assert mark is not None
    assert transcript(await log_of(pg_store, "c")) == [
        ("user", "first"), ("assistant", "first"), ("user", "second"), ("assistant", "second")]


async def test_a_message_received_by_another_worker_wakes_the_holder(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """B receives the conversation's next message while A keeps its lease: B tells A, and A
    answers it at once (well within its linger), under the same claim; B calls no model."""
    lease = Keys(prefix).lease(KEY)
    provider_a, provider_b = echo(), echo()
    async with worker(prefix, pg_store, provider_a, tmp_path / "p", ttl=30, linger=LONG) as a, \
            worker(prefix, pg_store, provider_b, tmp_path / "p", ttl=30, linger=LONG) as b:
        await a.channel.say("c", "first", platform_id="first")
        await answered(a, "first")
        mark = await redis.get(lease)
        await b.channel.say("c", "second", platform_id="second")
        await answered(a, "second", b)
        assert await redis.get(lease) == mark
    assert answers(a) == ["first", "second"]
    assert (len(provider_a.requests), len(provider_b.requests)) == (2, 0)


async def test_a_kept_lease_that_passed_on_writes_and_answers_nothing(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis loses A's kept lease (as FLUSHDB does) and B serves the next message under a
    newer token; A, whose guard has not noticed (its renewal comes every 30 s), is then woken
    by a message of its own: its write is refused by the newer token, or Redis tells it the
    lease passed on, or (had its renewal come first) its guard stops it, so it hands the
    conversation back without calling its model or answering; B adopts the message, and every
    message is answered and recorded once."""
    lease = Keys(prefix).lease(KEY)
    provider_a, provider_b = echo(), echo()
    async with worker(prefix, pg_store, provider_a, tmp_path / "p", ttl=90, linger=LONG) as a, \
            worker(prefix, pg_store, provider_b, tmp_path / "p", ttl=3) as b:
        await a.channel.say("c", "first", platform_id="first")
        await answered(a, "first")
        await redis.delete(lease)
        # B takes the free lease, with a newer token
        await b.channel.say("c", "second", platform_id="second")
        await answered(b, "second")
        await a.channel.say("c", "third", platform_id="third")  # wakes A, still holding its claim
        await answered(b, "third")  # B's sweep adopts it once A has let go
    assert answers(a) == ["first"]
    assert answers(b) == ["second", "third"]
    assert (len(provider_a.requests), len(provider_b.requests)) == (1, 2)
    handed_back = ("fenced off", "has passed on", "lost the lease")  # write, check, renewal
    assert [r for r in caplog.records if any(w in r.getMessage() for w in handed_back)]
    assert transcript(await log_of(pg_store, "c")) == [
        ("user", "first"), ("assistant", "first"), ("user", "second"), ("assistant", "second"),
        ("user", "third"), ("assistant", "third")]


async def test_the_kept_lease_is_let_go_after_the_linger(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """With a short linger the lease goes once nothing came, and the next message takes a
    new one (another claim)."""
    lease = Keys(prefix).lease(KEY)
    async with worker(prefix, pg_store, echo(), tmp_path / "p", ttl=30,
                      linger=0.3) as a:
        await a.channel.say("c", "first", platform_id="first")
        await answered(a, "first")
        first = await redis.get(lease)
        await wait_gone(lambda: redis.exists(lease), 60)
        await a.channel.say("c", "second", platform_id="second")
        await answered(a, "second")
        second = await redis.get(lease)
    assert first is not None
    assert second != first


class Watched:
    """A worker's queue (our seam, over the real one) that says when its holder is asking
    for the item after its first: from then on it waits for more, holding its lease."""

    def __init__(self, inner: ConversationQueue) -> None:
        self.inner = inner
        self.asked = 0
        self.waiting = asyncio.Event()

    async def next(self, claim: Claim) -> QueueItem | None:
        self.asked += 1
        if self.asked == 2:
            self.waiting.set()
        return await self.inner.next(claim)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_stopping_worker_lets_its_kept_leases_go_at_once(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """Draining with a grace far longer than the test may take returns well before it: the
    holder waiting for more (asking for its next item, its lease kept) lets go as the drain
    begins, and its lease is released."""
    lease = Keys(prefix).lease(KEY)
    watched: list[Watched] = []

    def watch(inner: ConversationQueue) -> ConversationQueue:
        watched.append(Watched(inner))
        return cast(ConversationQueue, watched[-1])

    async with worker(prefix, pg_store, echo(), tmp_path / "p", ttl=30, linger=LONG,
                      queue=watch) as a:
        await a.channel.say("c", "first", platform_id="first")
        await answered(a, "first")
        async with asyncio.timeout(60):
            await watched[0].waiting.wait()
        assert await redis.exists(lease)
        async with asyncio.timeout(60):
            await a.router.drain(LONG)
        assert a.router.serving == 0
        assert not await redis.exists(lease)


async def test_kept_leases_do_not_keep_conversations_open_past_the_memory_bound(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """Six chats answered one after another, every lease kept (a linger no test waits out),
    with room in memory for about two answered conversations: the waiting holders do not
    hold their conversations in use, so each is weighed again after its turn and the least
    recently used are closed to make room (before: all six stayed in use and open, weighed
    as opened, as a benchmark worker's 2,000 chats grew past a 32 MiB bound to 287 MiB). A
    closed one that speaks again is opened from the store, under the lease it kept."""
    chats = [f"m{n}" for n in range(6)]
    async with worker(prefix, pg_store, echo(), tmp_path / "p", ttl=30, linger=LONG,
                      open_bytes=10_000) as a:
        for chat in chats:
            await a.channel.say(chat, f"hello {chat}", platform_id=f"{chat}-1")
            await answered(a, f"hello {chat}")
        leases = [await redis.get(Keys(prefix).lease(ConversationKey("memory", chat)))
                  for chat in chats]
        assert all(lease is not None for lease in leases)  # every one kept, waiting for more
        await wait_until(lambda: a.registry.held == 0, 60)  # the last one's use ended too
        weights = [conv.approx_bytes for key in a.registry.open_keys()
                   if (conv := a.registry.peek(key)) is not None]
        assert a.registry.open_bytes == sum(weights)  # weighed after their turns
        assert len(a.registry) < len(chats)  # closed to make room, their leases kept
        closed = next(chat for chat in chats
                      if a.registry.peek(ConversationKey("memory", chat)) is None)
        await a.channel.say(closed, "again", platform_id=f"{closed}-2")
        await answered(a, "again")
        assert await redis.get(Keys(prefix).lease(ConversationKey("memory", closed))) \
            == leases[chats.index(closed)]  # the same claim served it
    assert transcript(await log_of(pg_store, closed)) == [
        ("user", f"hello {closed}"), ("assistant", f"hello {closed}"),
        ("user", "again"), ("assistant", "again")]
