"""A holder's first item may have been recorded by a holder with an older token.

Taking the head row counts it as taken (``attempts``), and an item taken for the first time
is recorded without looking at the log: nobody took it before. But after Redis lost the
leases (FLUSHDB), the old holder, whose guard still trusts its lease, can take the same row
just *after* the new holder did (its answer of the message before takes the next one in the
same statement), and record it under its older token before the new holder opens the
session under its newer one. Found as ``u:c18-3 u:c18-3`` in the redis-flush trial under
load (one message recorded twice, answered once). The new holder reads the log as it opens
the session: it looks its first item up there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from gateway.delivery.registry import ConversationRegistry
from gateway.delivery.serving import meta_of
from gateway.delivery.speakers import user_message
from gateway.edge.coordination import Claim, ConversationQueue, QueueItem
from gateway.edge.messages import ChannelContext, ConversationKey
from gateway.edge.metrics import Metrics
from sessions.postgres.inbox import PostgresInbox
from sessions.postgres.store import PostgresSessionStore
from tests.coordination.harness import log_of, transcript, wait_until, worker
from tests.coordination.test_holders import Recalling, finals

pytestmark = [pytest.mark.services, pytest.mark.timeout(120)]

KEY = ConversationKey("memory", "c")
CONTEXT = ChannelContext("memory", "private", "u")


class OlderHolderFirst:
    """A worker's queue (our seam, over the real one): once the holder has taken its first
    item, the old holder (``record``) records the same item before the holder goes on."""

    def __init__(self, inner: ConversationQueue, record: Any) -> None:
        self.inner = inner
        self.record = record
        self.taken: list[QueueItem] = []

    async def next(self, claim: Claim) -> QueueItem | None:
        item = await self.inner.next(claim)
        if item is not None and not self.taken:
            self.taken.append(item)
            await self.record(item)
        return item

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_first_item_recorded_by_an_older_holder_is_recorded_once(
    prefix: str, pg_store: PostgresSessionStore, tmp_path: Path,
) -> None:
    provider = Recalling()
    inbox = PostgresInbox(pg_store)
    old_token = await inbox.next_fence()  # the old holder's: drawn before the new holder's
    old = ConversationRegistry(pg_store, Metrics())
    queues: list[OlderHolderFirst] = []

    async def old_holder_records(item: QueueItem) -> None:
        assert not item.resumed  # the new holder took the row first
        conv = await old.get(KEY, CONTEXT, fence=old_token)
        await conv.receive(user_message(item.inbound), meta_of(item))

    def wrap(inner: ConversationQueue) -> ConversationQueue:
        queues.append(OlderHolderFirst(inner, old_holder_records))
        return cast(ConversationQueue, queues[-1])

    try:
        async with worker(prefix, pg_store, provider, tmp_path / "p", ttl=60,
                          queue=wrap) as new:
            await new.channel.say("c", "first")
            await wait_until(lambda: finals(list(new.channel.events)) != [], 30)
    finally:
        await old.aclose()
    assert queues[0].taken, "the holder should have taken the item"
    assert finals(list(new.channel.events)) == [("c", "finish", "first")]
    assert len(provider.requests) == 1
    replay = await log_of(pg_store, "c")
    assert transcript(replay) == [("user", "first"), ("assistant", "first")]
