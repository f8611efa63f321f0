"""Several workers: an answer recorded in the log is the answer, before the item is marked
answered. A holder that recorded an answer and died before its reply reached the waiting
request (or before it marked the item answered) leaves the request's retry, and the waiting
request's look-up, to find it in the log at once, not after the next holder's takeover."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from gateway.edge.channel import Answer
from gateway.edge.coordination import Claim, ConversationQueue, QueueItem
from sessions.postgres.inbox import PostgresInbox
from sessions.postgres.store import PostgresSessionStore
from tests.coordination.harness import worker
from tests.fakes.scripted_provider import ScriptedProvider

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]


class NeverMarked:
    """The queue of a worker that dies right after its reply went out: nothing is marked
    answered (``done`` never returns)."""

    def __init__(self, inner: ConversationQueue) -> None:
        self.inner = inner
        self.reached = asyncio.Event()

    async def done(self, claim: Claim, item: QueueItem) -> None:
        self.reached.set()
        await asyncio.get_running_loop().create_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_retry_gets_an_answer_recorded_but_not_marked(
    prefix: str, redis: aioredis.Redis, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    """The answer is in the log, the item not marked answered (its holder is as good as
    dead): the platform's retry of the message gets that answer at once (it waited for the
    inbox before, so until the next holder took the conversation over)."""
    provider = ScriptedProvider()
    provider.script("the recorded answer")
    queues: list[NeverMarked] = []

    def never_marked(inner: ConversationQueue) -> ConversationQueue:
        queues.append(NeverMarked(inner))
        return cast(ConversationQueue, queues[-1])

    async with worker(prefix, pg_store, provider, tmp_path / "p", ttl=60,
                      queue=never_marked) as a:
        await a.channel.say("c", "question", platform_id="p1")
        async with asyncio.timeout(30):
            await queues[0].reached.wait()
        retry = await a.channel.say("c", "question", platform_id="p1")
        assert retry is not None
        assert retry.duplicate
        assert retry.earlier is not None
        answer = await asyncio.wait_for(retry.earlier(0), 10)
        owed = await PostgresInbox(pg_store).owed_conversations()
    assert isinstance(answer, Answer)
    assert (answer.ok, answer.text) == (True, "the recorded answer")
    assert len(owed) == 1  # not marked answered: the log alone said so
