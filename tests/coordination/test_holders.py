"""Holders of a conversation and what they may do: a final answer goes out only once its
entries are saved (or not at all if the lease goes first), a holder whose lease passed on
hands the conversation back instead of raising its token (or finding its copy behind the log),
and ``/forget`` served by one worker reaches a worker that cached the person's conversation."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest
import redis.asyncio as aioredis

from coordination.keys import Keys, member
from gateway.agent.loop import APOLOGY
from gateway.delivery.pause import Pauses
from gateway.delivery.registry import ConversationRegistry
from gateway.delivery.serving import meta_of
from gateway.delivery.speakers import user_message
from gateway.edge.commands import FORGET, CommandHandler
from gateway.edge.coordination import Claim, ConversationQueue, QueueItem
from gateway.edge.messages import ChannelContext, ConversationKey
from gateway.edge.metrics import Metrics
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from gateway.edge.scopes import scope_of
from gateway.erasure.eraser import Eraser
from gateway.erasure.forget import DONE_REPLY, ForgetCommand
from gateway.erasure.service import ErasureService
from sessions.postgres import schema as pg_schema
from sessions.postgres.inbox import PostgresInbox
from sessions.postgres.store import PostgresSessionStore
from sessions.store import SessionStore
from tests.coordination.harness import (
    Worker,
    coordinator,
    log_of,
    transcript,
    wait_until,
    worker,
)
from tests.coordination.private_services import PrivatePostgres
from tests.fakes.providers import content_text
from tests.fakes.scripted_provider import ScriptedProvider

pytestmark = [pytest.mark.services, pytest.mark.timeout(240)]

KEY = ConversationKey("memory", "c")
CONTEXT = ChannelContext("memory", "private", "u")
TTL = 3.0
"""Lease lifetime of the workers whose database goes down (renewed every second: a busy
machine does not make them lose it by themselves)."""


@pytest.fixture
async def private_store(pg: PrivatePostgres) -> AsyncIterator[PostgresSessionStore]:
    if not pg.up:
        await pg.start()  # a failed test before may have left it down
    name = f"gw_holders_{secrets.token_hex(5)}"
    conn = await asyncpg.connect(pg.url, timeout=10)
    try:
        await pg_schema.upgrade(conn, name)
    finally:
        await conn.close()
    store = await PostgresSessionStore.connect(pg.url, schema=name)
    try:
        yield store
    finally:
        if not pg.up:
            await pg.start()
        await store.aclose()


class DownWhileAnswering(ScriptedProvider):
    """Streams ``text``; the first time, PostgreSQL is stopped while the model answers (after
    the call entry is written, before the answer is)."""

    def __init__(self, pg: PrivatePostgres, text: str) -> None:
        super().__init__()
        self.pg = pg
        self.text = text

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        if not self.requests:
            await self.pg.stop()
        self.script(self.text)
        return await super().complete(request, on_text)


def persist_failures(metrics: Metrics) -> float:
    """Session writes that failed, of every kind."""
    return sum(sample.value for family in metrics.registry.collect()
               if family.name == "gateway_persist_failures"
               for sample in family.samples if sample.name.endswith("_total"))


def finals(events: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [e for e in events if e[1] in ("finish", "fail")]


async def test_answer_waits_for_its_entries_and_a_lost_lease_sends_nothing(
    prefix: str, redis: aioredis.Redis, pg: PrivatePostgres,
    private_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """The database goes down while the model answers; the lease passes on before the answer
    is saved: the holder never sends it and takes its streamed preview back, and the next
    holder's answer is the only one (the old code sent both, and the log held only the
    second; then it left the preview standing above the new holder's answer)."""
    first = DownWhileAnswering(pg, "first answer")
    second = ScriptedProvider()
    second.script("second answer")
    async with worker(prefix, private_store, first, tmp_path / "p", ttl=TTL) as a:
        await a.channel.say("c", "question")
        # The answer's append and the end-of-turn flush failed: the turn has decided what
        # to do with its final reply (the old code sent it right there).
        await wait_until(lambda: persist_failures(a.router.metrics) >= 2, 60)
        # Another worker holds the lease now (as after a pause or a Redis flush).
        await redis.set(Keys(prefix).lease(KEY), "another-worker", px=60_000)
        await wait_until(lambda: a.router.serving == 0, 10)  # its renewal notices: cut off
    events = list(a.channel.events)  # the router has closed: its retraction task is done
    await pg.start()
    await redis.delete(Keys(prefix).lease(KEY))
    async with worker(prefix, private_store, second, tmp_path / "p", ttl=TTL) as b:
        await b.channel.wait_replies(1, timeout=30)
    # The preview streamed, then was taken back; no final answer.
    assert [e for e in events if e[1] != "typing"] == [
        ("c", "delta", "first answer"), ("c", "retract", "")]
    assert b.channel.replies == [("c", "finish", "second answer")]
    replay = await log_of(private_store, "c")
    assert transcript(replay) == [("user", "question"), ("assistant", "second answer")]


class StallsAfterADelta(ScriptedProvider):
    """Streams part of an answer, then keeps thinking until its call is cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.streamed = asyncio.Event()

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        assert on_text is not None
        await on_text("half an answer")
        self.streamed.set()
        await asyncio.get_running_loop().create_future()  # until the lease guard cancels it
        raise AssertionError("the call outlived the lease")


async def test_a_lease_lost_mid_stream_takes_the_preview_back(
    prefix: str, redis: aioredis.Redis, private_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """The lease passes on while the model is still streaming: the turn is cut off before
    any final reply, its streamed preview is taken back, and the next holder's answer is the
    only one the person reads."""
    first = StallsAfterADelta()
    second = ScriptedProvider()
    second.script("the whole answer")
    async with worker(prefix, private_store, first, tmp_path / "p", ttl=TTL) as a:
        await a.channel.say("c", "question")
        await asyncio.wait_for(first.streamed.wait(), 30)
        await redis.set(Keys(prefix).lease(KEY), "another-worker", px=60_000)
        await wait_until(lambda: a.router.serving == 0, 10)  # its renewal notices: cut off
    events = [e for e in a.channel.events if e[1] != "typing"]
    await redis.delete(Keys(prefix).lease(KEY))
    async with worker(prefix, private_store, second, tmp_path / "p", ttl=TTL) as b:
        await b.channel.wait_replies(1, timeout=30)
    assert events == [("c", "delta", "half an answer"), ("c", "retract", "")]
    assert b.channel.replies == [("c", "finish", "the whole answer")]
    replay = await log_of(private_store, "c")
    assert transcript(replay) == [("user", "question"), ("assistant", "the whole answer")]


async def test_answer_waits_for_its_entries_and_goes_out_once_they_are_saved(
    prefix: str, pg: PrivatePostgres, private_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """The database goes down while the model answers and comes back while the holder
    keeps its lease: the answer goes out once, after its entries are in the log."""
    provider = DownWhileAnswering(pg, "the answer")
    async with worker(prefix, private_store, provider, tmp_path / "p", ttl=TTL) as a:
        await a.channel.say("c", "question")
        await wait_until(lambda: persist_failures(a.router.metrics) >= 2, 60)
        held_back = finals(list(a.channel.events))
        await pg.start()
        await a.channel.wait_replies(1, timeout=60)
        await wait_until(lambda: a.router.serving == 0, 30)
    assert held_back == []
    assert a.channel.replies == [("c", "finish", "the answer")]
    replay = await log_of(private_store, "c")
    assert transcript(replay) == [("user", "question"), ("assistant", "the answer")]
    assert len(provider.requests) == 1


class GatedStore:
    """A session store (our seam) whose ``latest_session`` waits at a gate, once: the test
    moves the lease while a holder is about to open the session."""

    def __init__(self, inner: PostgresSessionStore) -> None:
        self.inner = inner
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def latest_session(self, tenant: str, conversation: str) -> str | None:
        self.reached.set()
        await self.go.wait()
        return await self.inner.latest_session(tenant, conversation)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_stale_holder_hands_the_conversation_back_instead_of_raising_its_token(
    prefix: str, redis: aioredis.Redis, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """A holder whose lease passed on (its guard does not know yet) finds the session under
    the new holder's newer token: it asks Redis, hands the conversation back, makes no model
    call and leaves the new holder writing (the old code raised its token past the new
    holder's, fenced it off and called its model)."""
    gated = GatedStore(pg_store)
    provider = ScriptedProvider()
    lease = Keys(prefix).lease(KEY)
    # Long leases: no renewal (every 20 s) tells A about the takeover during the test.
    async with worker(prefix, pg_store, provider, tmp_path / "p", ttl=60,
                      sessions=cast(SessionStore, gated)) as a, \
            coordinator(prefix, pg_store, ttl=60) as b:
        await a.channel.say("c", "hello")
        async with asyncio.timeout(10):
            await gated.reached.wait()  # A holds the lease and a token, and opens next
        await redis.delete(lease)  # Redis loses the lease; B takes the conversation
        [claim] = await b.conversations.sweep()
        claim.token = await b.conversations.inbox.next_fence()
        registry = ConversationRegistry(pg_store, Metrics())
        conv = await registry.get(KEY, CONTEXT, fence=claim.token)
        gated.go.set()
        await wait_until(lambda: a.router.serving == 0, 10)
        called = list(provider.requests)
        holder = await redis.get(lease)
        await conv.receive({"role": "user", "content": "from b"}, {"sender": "u"})  # B writes
        await registry.aclose()
    assert called == []
    assert holder is not None
    assert holder.split("/")[0] == b.worker
    assert a.channel.replies == []
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "from b")]


class Recalling(ScriptedProvider):
    """Answers with every user text it was sent, so an answer shows what the model saw."""

    def __init__(self) -> None:
        super().__init__(responder=lambda request: " | ".join(
            content_text(m["content"]) for m in request.messages if m["role"] == "user"))


def forget_handler(store: PostgresSessionStore
                   ) -> Callable[[ConversationRegistry], Mapping[str, CommandHandler]]:
    """``/forget`` as the composition root wires it, but for the bus to the other workers: the
    worker holds its own copies still, erases, drops them (the others learn at their next
    claim, which is what these tests show)."""
    def make(registry: ConversationRegistry) -> Mapping[str, CommandHandler]:
        return {FORGET.name: ForgetCommand(ErasureService(Eraser(store), Pauses(registry))).run}

    return make


async def test_forget_reaches_a_worker_that_cached_the_conversation(
    prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """B served a person, A serves their ``/forget confirm``, then B serves them again: B
    opens the conversation from the store (a new session, nothing of the erased history),
    instead of trying to carry on its cached copy of a deleted session (the old code retried
    that forever: the message was never answered). It finds out as it takes the conversation
    back, before any write (not by a write to the erased session being refused)."""
    handlers = forget_handler(pg_store)
    provider = Recalling()
    # Long leases: the sweeps (every 5 to 15 s) do not take a conversation over meanwhile.
    async with worker(prefix, pg_store, provider, tmp_path / "p", ttl=30,
                      handlers=handlers) as a, \
            worker(prefix, pg_store, provider, tmp_path / "p", ttl=30,
                   handlers=handlers) as b:
        # (Platform ids of our own: each memory channel counts from m1.)
        await b.channel.say("c", "my secret is 42", platform_id="p1")
        await b.channel.wait_replies(1)
        await wait_until(lambda: b.router.serving == 0)  # B gave the lease up, cached it
        assert b.registry.peek(KEY) is not None
        await a.channel.say("c", "/forget confirm", platform_id="p2")
        [(_, _, done)] = await a.channel.wait_replies(1)
        await wait_until(lambda: a.router.serving == 0)
        await b.channel.say("c", "what is my secret?", platform_id="p3")
        await b.channel.wait_replies(2, timeout=20)
    assert persist_failures(b.router.metrics) == 0
    assert done == DONE_REPLY.format(memory="0 files", sessions="1 conversation")
    assert b.channel.replies == [("c", "finish", "my secret is 42"),
                                 ("c", "finish", "what is my secret?")]
    sessions = await pg_store.list_sessions("default")
    assert len(sessions) == 1
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "what is my secret?"),
                                  ("assistant", "what is my secret?")]


async def test_new_served_elsewhere_is_not_undone_by_a_cached_copy(
    prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """B served a message, A serves ``/new``, then B serves the next message: it goes to the
    new session (the old code carried on B's cached copy of the old one, which had not grown,
    so the conversation went back to the history ``/new`` had left)."""
    provider = Recalling()
    async with worker(prefix, pg_store, provider, tmp_path / "p", ttl=30) as a, \
            worker(prefix, pg_store, provider, tmp_path / "p", ttl=30) as b:
        await b.channel.say("c", "before", platform_id="p1")
        await b.channel.wait_replies(1)
        await wait_until(lambda: b.router.serving == 0)
        await a.channel.say("c", "/new", platform_id="p2")
        await a.channel.wait_replies(1)
        await wait_until(lambda: a.router.serving == 0)
        await b.channel.say("c", "after", platform_id="p3")
        await b.channel.wait_replies(2)
    assert b.channel.replies == [("c", "finish", "before"), ("c", "finish", "after")]
    assert len(await pg_store.list_sessions("default")) == 2
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "after"), ("assistant", "after")]


class HeldFirst(Recalling):
    """A :class:`Recalling` model whose first call answers only once ``go`` is set
    (``reached`` says it got there): the test queues the next message meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        if not self.reached.is_set():
            self.reached.set()
            await self.go.wait()
        return await super().complete(request, on_text)


class BetweenItems:
    """A worker's queue (our seam, over the real one): before its holder looks for the item
    after its first, ``meanwhile`` runs (what another worker does at that moment)."""

    def __init__(self, inner: ConversationQueue,
                 meanwhile: Callable[[], Awaitable[None]]) -> None:
        self.inner = inner
        self.meanwhile = meanwhile
        self.asked = 0
        self.ran = False

    async def next(self, claim: Claim) -> QueueItem | None:
        self.asked += 1
        if self.asked == 2:
            await self.meanwhile()
            self.ran = True
        return await self.inner.next(claim)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def between_items(meanwhile: Callable[[], Awaitable[None]], queues: list[BetweenItems]
                  ) -> Callable[[ConversationQueue], ConversationQueue]:
    def wrap(inner: ConversationQueue) -> ConversationQueue:
        queues.append(BetweenItems(inner, meanwhile))
        return cast(ConversationQueue, queues[-1])

    return wrap


async def two_messages(a: Worker, provider: HeldFirst, queue: BetweenItems) -> None:
    """``first`` and, queued while A answers it, ``second``; until A's holder has ended."""
    await a.channel.say("c", "first")
    async with asyncio.timeout(10):
        await provider.reached.wait()  # A holds the lease; the next message waits for it
    await a.channel.say("c", "second")
    provider.go.set()
    await wait_until(lambda: queue.ran and a.router.serving == 0, 10)


async def test_holder_whose_copy_is_behind_the_log_hands_the_item_back(
    prefix: str, redis: aioredis.Redis, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """Redis loses A's lease between two of its items and B takes the conversation and records
    the next item under its newer token; A, whose guard still trusts its lease, then takes the
    same item (marked resumed) and finds it in the log past the end of its cached copy: it
    hands the conversation back and sends nothing (the old code looked the log's index up in
    that copy, IndexError in Conversation.begin, and sent the apology as the item's answer)."""
    provider = HeldFirst()
    lease = Keys(prefix).lease(KEY)
    queues: list[BetweenItems] = []
    async with coordinator(prefix, pg_store, ttl=60) as b:
        registry_b = ConversationRegistry(pg_store, Metrics())
        taken: list[QueueItem] = []

        async def takeover() -> None:  # as after FLUSHDB: B takes the lease and the head
            await redis.delete(lease)
            [claim] = await b.conversations.sweep()
            claim.token = await b.conversations.inbox.next_fence()
            head = await b.conversations.next(claim)
            assert head is not None
            conv = await registry_b.get(KEY, CONTEXT, fence=claim.token)
            await conv.receive(user_message(head.inbound), meta_of(head))
            taken.append(head)

        # Long leases: no renewal (every 20 s) tells A about the takeover during the test.
        async with worker(prefix, pg_store, provider, tmp_path / "p", ttl=60,
                          queue=between_items(takeover, queues)) as a:
            await two_messages(a, provider, queues[0])
            holder = await redis.get(lease)
        status = await b.conversations.inbox.status(taken[0].id)
        await registry_b.aclose()
    assert finals(list(a.channel.events)) == [("c", "finish", "first")]
    assert len(provider.requests) == 1
    assert holder is not None
    assert holder.split("/")[0] == b.worker
    assert status == (False, None)  # still B's to answer
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "first"), ("assistant", "first"), ("user", "second")]


async def test_forget_served_elsewhere_between_a_holders_items(
    prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """The person's ``/forget`` is served by another worker while A holds their conversation,
    between two items; the second was taken by a holder before (it comes back resumed). A
    looks it up in a new session, not in its copy of the erased one, and the model sees none
    of the erased history (the old code failed to read the erased log, and tried again for as
    long as it held the lease: the message was never answered)."""
    provider = HeldFirst()
    inbox = PostgresInbox(pg_store)
    queues: list[BetweenItems] = []

    async def forget() -> None:
        conv = a.registry.peek(KEY)
        assert conv is not None
        await Eraser(pg_store).erase(scope_of(conv.context), requested_by="self")
        assert await inbox.head(KEY.tenant, member(KEY)) is not None  # an earlier holder's

    async with worker(prefix, pg_store, provider, tmp_path / "p", ttl=60,
                      queue=between_items(forget, queues)) as a:
        await two_messages(a, provider, queues[0])
    assert finals(list(a.channel.events)) == [("c", "finish", "first"),
                                              ("c", "finish", "second")]
    assert len(await pg_store.list_sessions("default")) == 1
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "second"), ("assistant", "second")]


async def test_a_copy_whose_writes_were_dropped_is_not_handed_the_log(
    pg: PrivatePostgres, private_store: PostgresSessionStore,
) -> None:
    """A's message accepted while the database was down is dropped when B's newer token
    refuses it: the log then holds as many messages as A's copy, but not the same ones, so
    the copy is not handed the log (an index found there would be another message's in it)."""
    store = private_store
    tokens = [await store.next_fence() for _ in range(2)]
    registry_a = ConversationRegistry(store, Metrics(), persist_timeout=1.0)
    registry_b = ConversationRegistry(store, Metrics())
    conv_a = await registry_a.get(KEY, CONTEXT, fence=tokens[0])
    await conv_a.receive({"role": "user", "content": "from a"}, {"sender": "u"})
    await pg.stop()
    try:  # accepted, kept to be written ahead of the next append
        await conv_a.receive({"role": "user", "content": "late from a"}, {"sender": "u"})
    finally:
        await pg.start()
    conv_b = await registry_b.get(KEY, CONTEXT, fence=tokens[1])
    await conv_b.receive({"role": "user", "content": "from b"}, {"sender": "u"})
    await conv_a.recorder.flush()  # refused as stale: dropped
    replay = await log_of(store, "c")
    assert len(conv_a.messages) == len(replay.messages) == 2
    assert await registry_a.read_log(KEY, conv_a) is None
    assert registry_a.peek(KEY) is None
    assert await registry_b.read_log(KEY, conv_b) is not None  # B's copy is the log
    await registry_a.aclose()
    await registry_b.aclose()


class CutOffThenHeld(Recalling):
    """A :class:`Recalling` model: its first call hangs until the lease guard cuts it off, its
    second answers once ``go`` is set (``second`` says it got there)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.first = asyncio.Event()
        self.second = asyncio.Event()
        self.go = asyncio.Event()

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        self.calls += 1
        if self.calls == 1:
            self.first.set()
            await asyncio.get_running_loop().create_future()  # until the lease guard cancels it
            raise AssertionError("the call outlived the lease")
        if self.calls == 2:
            self.second.set()
            await self.go.wait()
        return await super().complete(request, on_text)


class GatedRelease:
    """A worker's queue (our seam, over the real one) whose first release waits at a gate:
    the test acts between a holder's end and its release of the lease."""

    def __init__(self, inner: ConversationQueue) -> None:
        self.inner = inner
        self.releases = 0
        self.reached = asyncio.Event()
        self.go = asyncio.Event()
        self.released = asyncio.Event()

    async def release(self, claim: Claim) -> None:
        self.releases += 1
        if self.releases > 1:
            await self.inner.release(claim)
            return
        self.reached.set()
        await self.go.wait()
        await self.inner.release(claim)
        self.released.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_holder_cut_off_leaves_the_next_holder_of_its_worker_its_lease(
    prefix: str, redis: aioredis.Redis, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """A's holder is cut off (its lease passed on); before it has released the lease, the
    lease is free again and A serves the conversation anew. The old holder's late release
    leaves the new holder's lease in place, and the new holder answers both messages, once
    (the old code released any lease with A's worker id: the new holder was left serving
    without a lease, another worker could take the conversation meanwhile, and its renewal
    cut it off)."""
    provider = CutOffThenHeld()
    lease = Keys(prefix).lease(KEY)
    gates: list[GatedRelease] = []

    def gated(inner: ConversationQueue) -> ConversationQueue:
        gates.append(GatedRelease(inner))
        return cast(ConversationQueue, gates[-1])

    async with worker(prefix, pg_store, provider, tmp_path / "p", ttl=TTL, queue=gated) as a:
        gate = gates[0]
        await a.channel.say("c", "question")
        async with asyncio.timeout(10):
            await provider.first.wait()
        await redis.set(lease, "another-worker", px=60_000)  # its renewal notices: cut off
        async with asyncio.timeout(10):
            await gate.reached.wait()  # the old holder has ended, its release not yet run
        await redis.delete(lease)  # the other worker let it go
        await a.channel.say("c", "again")  # A claims it anew (or its sweep did already)
        async with asyncio.timeout(10):
            await provider.second.wait()  # the new holder runs the cut-off turn again
        gate.go.set()
        async with asyncio.timeout(10):
            await gate.released.wait()
        holder = await redis.get(lease)
        provider.go.set()
        await a.channel.wait_replies(2, timeout=30)
        await wait_until(lambda: a.router.serving == 0, 10)
    assert holder is not None  # the new holder's lease, still there
    assert holder.split("/")[0] == a.coordinator.worker
    assert finals(list(a.channel.events)) == [("c", "finish", "question"),
                                              ("c", "finish", "question | again")]
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "question"), ("assistant", "question"),
                                  ("user", "again"), ("assistant", "question | again")]


class FailsOnce(ScriptedProvider):
    """A model whose first call fails with a bug (no :class:`ProviderError`); with ``lease``,
    after that lease has passed to another worker (Redis moved it; the holder's guard does not
    know yet)."""

    def __init__(self, redis: aioredis.Redis, lease: str | None) -> None:
        super().__init__()
        self.redis = redis
        self.lease = lease
        self.failed = False

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        if not self.failed:
            self.failed = True
            if self.lease is not None:
                await self.redis.set(self.lease, "another-worker", px=60_000)
            raise RuntimeError("a bug in the turn")
        return await super().complete(request, on_text)


class BreaksOnce:
    """A session store (our seam) whose first ``latest_session`` fails with a bug (no store
    fault), so the holder fails before the turn; with ``lease``, after that lease has passed
    to another worker."""

    def __init__(self, inner: PostgresSessionStore, redis: aioredis.Redis,
                 lease: str | None) -> None:
        self.inner = inner
        self.redis = redis
        self.lease = lease
        self.broke = False

    async def latest_session(self, tenant: str, conversation: str) -> str | None:
        if not self.broke:
            self.broke = True
            if self.lease is not None:
                await self.redis.set(self.lease, "another-worker", px=60_000)
            raise RuntimeError("a bug before the turn")
        return await self.inner.latest_session(tenant, conversation)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@asynccontextmanager
async def failing_once(where: str, prefix: str, redis: aioredis.Redis,
                       store: PostgresSessionStore, persona: Path, *, passes_on: bool
                       ) -> AsyncIterator[Worker]:
    """A worker whose first item fails with a bug, in its turn or before it (``where``);
    ``passes_on``: the lease passes to another worker first. Long leases: no renewal (every
    20 s) tells the worker about that during the test."""
    lease = Keys(prefix).lease(KEY) if passes_on else None
    provider: ScriptedProvider = ScriptedProvider()
    sessions: SessionStore = store
    if where == "turn":
        provider = FailsOnce(redis, lease)
    else:
        sessions = cast(SessionStore, BreaksOnce(store, redis, lease))
    async with worker(prefix, store, provider, persona, ttl=60, sessions=sessions) as a:
        yield a


@pytest.mark.parametrize("where", ["turn", "before the turn"])
async def test_a_holder_whose_lease_passed_on_sends_no_apology(
    where: str, prefix: str, redis: aioredis.Redis, pg_store: PostgresSessionStore,
    tmp_path: Path,
) -> None:
    """A bug fails the item (in its turn, or while it is prepared) after the lease has passed
    to another worker, which the holder's guard does not know yet: the apology is no recorded
    answer, so the holder asks Redis first, sends nothing and hands the conversation back, and
    the next holder's answer is the only one (the old code sent the apology on the local
    check alone, or on none before the turn, and the item counted as answered)."""
    async with failing_once(where, prefix, redis, pg_store, tmp_path / "p",
                            passes_on=True) as a:
        await a.channel.say("c", "question")
        await wait_until(lambda: a.router.serving == 0, 10)
    assert finals(list(a.channel.events)) == []
    await redis.delete(Keys(prefix).lease(KEY))  # the other worker let it go: adopted next
    second = ScriptedProvider()
    second.script("the answer")
    async with worker(prefix, pg_store, second, tmp_path / "p", ttl=TTL) as b:
        await b.channel.wait_replies(1, timeout=30)
    assert b.channel.replies == [("c", "finish", "the answer")]
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "question"), ("assistant", "the answer")]


@pytest.mark.parametrize("where", ["turn", "before the turn"])
async def test_a_holder_that_keeps_its_lease_sends_the_apology_once(
    where: str, prefix: str, redis: aioredis.Redis, pg_store: PostgresSessionStore,
    tmp_path: Path,
) -> None:
    """The same bug while the holder keeps its lease: Redis confirms it, the apology goes
    out once and the item counts as answered (nothing is owed for another holder)."""
    inbox = PostgresInbox(pg_store)
    async with failing_once(where, prefix, redis, pg_store, tmp_path / "p",
                            passes_on=False) as a:
        await a.channel.say("c", "question")
        await a.channel.wait_replies(1, timeout=30)
        await wait_until(lambda: a.router.serving == 0, 10)
    assert finals(list(a.channel.events)) == [("c", "fail", APOLOGY)]
    assert await inbox.owed_conversations() == []
