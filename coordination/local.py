"""One gateway process: queues in memory, no leases to renew, nothing to elect.

This is the behaviour the router always had: a message is recorded the moment it arrives
(``records_on_receipt``), queued in a per-conversation deque, and served by the one task the
claim starts; the claim ends, with no await in between, when the deque is empty.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Self

from coordination.memory_dedup import MemoryDeduplicator
from gateway.coordination import Claim, QueueItem, Ticket
from gateway.dedup import Deduplicator
from gateway.messages import ConversationKey
from gateway.pairing import PairingState


class LocalConversations:
    """See :class:`gateway.coordination.base.ConversationQueue`."""

    records_on_receipt = True

    def __init__(self) -> None:
        self._queues: dict[ConversationKey, deque[QueueItem]] = {}

    @property
    def queued(self) -> int:
        # The head of each queue is the item being served, not waiting.
        return sum(max(0, len(q) - 1) for q in self._queues.values())

    async def submit(self, item: QueueItem, dedup_key: str | None = None) -> Ticket:
        # dedup_key is not used: in one process the router checks it before recording.
        key = item.inbound.key
        queue = self._queues.get(key)
        if queue is None:
            self._queues[key] = deque([item])
            return Ticket(claim=Claim(key))
        queue.append(item)
        return Ticket()

    async def next(self, claim: Claim) -> QueueItem | None:
        queue = self._queues.get(claim.key)
        if not queue:
            self._queues.pop(claim.key, None)
            return None
        return queue[0]

    async def done(self, claim: Claim, item: QueueItem) -> None:
        queue = self._queues.get(claim.key)
        if queue and queue[0] is item:
            queue.popleft()

    def holding(self, claim: Claim) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def release(self, claim: Claim) -> None:
        # Only reached early at shutdown (or when a turn could not be served): what is left is
        # dropped with the process, as it always was.
        self._queues.pop(claim.key, None)

    async def refence(self, claim: Claim, at_least: int) -> None:
        claim.token = at_least

    async def recorded(self, item: QueueItem, session_id: str) -> None:
        return None

    async def wait_recorded(self, item: QueueItem, within: float) -> str | None:
        return None

    async def adoptions(self) -> AsyncIterator[Claim]:
        # Nothing is ever orphaned in one process.
        return
        yield  # pragma: no cover  (makes this an async generator)


class InProcessCoordinator:
    """The default :class:`~gateway.coordination.base.Coordinator`: one gateway process."""

    def __init__(self, dedup: Deduplicator | None = None) -> None:
        self.conversations = LocalConversations()
        self.dedup: Deduplicator = dedup or MemoryDeduplicator()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        return None

    def deduplicator(self, namespace: str, ttl: float) -> Deduplicator | None:
        return None

    def elector(self, name: str) -> None:
        return None

    def pairing_state(self) -> PairingState | None:
        return None

    def health(self) -> Mapping[str, Any]:
        return {"mode": "single"}
