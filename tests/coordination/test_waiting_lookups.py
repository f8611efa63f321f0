"""What a request waiting for its reply (the web chat's) costs the database while it waits:
nothing while its own worker serves the conversation, and otherwise one small read a look,
the log read only once it has moved and then stayed still, so an answer recorded by a holder
that never relayed it is still found."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from gateway.edge.channel import Accepted, Answer
from gateway.edge.coordination import Claim, ConversationQueue, QueueItem
from gateway.edge.messages import ConversationKey, Inbound, Sender
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from sessions.postgres.store import PostgresSessionStore
from tests.coordination.harness import Worker, worker
from tests.fakes.memory_channel import MemoryChannel
from tests.fakes.scripted_provider import ScriptedProvider

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

KEY = ConversationKey("memory", "c")


class Counted:
    """The session store, counting the reads a waiting request's looks make."""

    def __init__(self, inner: PostgresSessionStore) -> None:
        self.inner = inner
        self.marks = 0
        self.reads = 0

    async def log_mark(self, tenant: str, conversation: str) -> tuple[str, int] | None:
        self.marks += 1
        return await self.inner.log_mark(tenant, conversation)

    async def read_log(self, tenant: str, session_id: str) -> bytes:
        self.reads += 1
        return await self.inner.read_log(tenant, session_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Held(ScriptedProvider):
    """Answers once ``go`` is set (``reached`` says a call got there)."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        self.reached.set()
        await self.go.wait()
        self.script("the answer")
        return await super().complete(request, on_text)


class NeverMarked:
    """The queue of a holder that dies right after answering ``question``: it is never
    marked answered (``done`` never returns for it)."""

    def __init__(self, inner: ConversationQueue) -> None:
        self.inner = inner
        self.reached = asyncio.Event()

    async def done(self, claim: Claim, item: QueueItem) -> None:
        if item.inbound.text != "question":
            await self.inner.done(claim, item)
            return
        self.reached.set()
        await asyncio.get_running_loop().create_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def waiting(w: Worker, text: str) -> Accepted:
    """A message delivered with a sink of its own (as the web chat's request)."""
    channel = MemoryChannel()
    inbound = Inbound(KEY, Sender("u"), text, platform_id=text)
    accepted = await w.router.deliver(inbound, channel.reply_sink(inbound))
    assert accepted.answered is not None
    return accepted


async def test_a_request_its_own_worker_serves_looks_nothing_up(
    prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """While the worker that received the request holds the conversation (the model is
    answering), its looks read nothing: the reply comes straight from its own holder."""
    provider, counted = Held(), Counted(pg_store)
    async with worker(prefix, pg_store, provider, tmp_path / "p", ttl=30,
                      sessions=cast(PostgresSessionStore, counted)) as a:
        accepted = await waiting(a, "question")
        async with asyncio.timeout(30):
            await provider.reached.wait()
        assert accepted.answered is not None
        looks = [await accepted.answered(0) for _ in range(3)]
        provider.go.set()
    assert looks == [None, None, None]
    assert (counted.marks, counted.reads) == (0, 0)


async def test_an_answer_recorded_but_never_relayed_is_found_reading_the_log_twice(
    prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """B waits for a reply that A serves. While A's model answers, B's looks are one small
    read each, and the log is read once (after it stayed still for a look); A records the
    answer and dies before marking it answered (its relayed reply lost, as after a Redis
    flush): B's next look sees the log moved, the one after reads it and finds the answer
    (two reads in all)."""
    provider, counted = Held(), Counted(pg_store)
    queues: list[NeverMarked] = []

    def dying(inner: ConversationQueue) -> ConversationQueue:
        queues.append(NeverMarked(inner))
        return cast(ConversationQueue, queues[-1])

    async with worker(prefix, pg_store, provider, tmp_path / "a", ttl=30, queue=dying) as a, \
            worker(prefix, pg_store, ScriptedProvider(), tmp_path / "b", ttl=30,
                   sessions=cast(PostgresSessionStore, counted)) as b:
        await a.channel.say("c", "first", platform_id="first")  # A holds the conversation
        async with asyncio.timeout(30):
            await provider.reached.wait()
        accepted = await waiting(b, "question")
        assert accepted.answered is not None
        while_answering = [await accepted.answered(0) for _ in range(4)]
        reads_while_answering = counted.reads
        provider.go.set()  # A answers "first", then "question" ...
        async with asyncio.timeout(30):
            await queues[0].reached.wait()  # ... records its answer, and is as good as dead
        after = [await accepted.answered(0) for _ in range(2)]
    assert while_answering == [None, None, None, None]
    assert reads_while_answering <= 1
    assert after[0] is None
    assert isinstance(after[1], Answer)
    assert after[1].text == "the answer"
    assert counted.reads == reads_while_answering + 1
    assert counted.marks == 6
