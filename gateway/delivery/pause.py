"""Conversations held still for an erasure (:class:`gateway.edge.erasure.Holder`).

The router brackets everything that may write a conversation's session with
:meth:`Pauses.active`: receiving a message (recorded on receipt in one process) and serving
an item (its turn). An erasure enters :meth:`Pauses.holding`: from then on new activity on
the conversations it covers waits, and the hold is granted once the activity already running
there has ended. Waiting deliveries are not acknowledged yet (the platform waits or sends
again); the hold lasts as long as the erasure, which rewrites a few logs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

from gateway.delivery.registry import ConversationRegistry
from gateway.edge.erasure import ErasureRefusedError, Hold
from gateway.edge.messages import ConversationKey


class Pauses:
    """See the module docstring; ``registry`` is where :meth:`drop` closes copies."""

    def __init__(self, registry: ConversationRegistry) -> None:
        self.registry = registry
        self._active: Counter[ConversationKey] = Counter()
        self._holds: list[tuple[Hold, asyncio.Event]] = []
        self._changed = asyncio.Event()

    def _released(self, key: ConversationKey) -> asyncio.Event | None:
        for hold, released in self._holds:
            if hold.covers(key):
                return released
        return None

    @asynccontextmanager
    async def active(self, key: ConversationKey) -> AsyncIterator[None]:
        """Bracket work that may write ``key``'s session: waits while a hold covers it."""
        while (released := self._released(key)) is not None:
            await released.wait()
        self._active[key] += 1
        try:
            yield
        finally:
            self._active[key] -= 1
            if self._active[key] <= 0:
                del self._active[key]
            self._changed.set()

    def _busy(self, hold: Hold) -> list[ConversationKey]:
        return [key for key, n in self._active.items()
                if hold.covers(key) and n > (1 if key == hold.exempt else 0)]

    @asynccontextmanager
    async def holding(self, hold: Hold, timeout: float) -> AsyncIterator[None]:  # noqa: ASYNC109
        """See :meth:`gateway.edge.erasure.Holder.holding`."""
        released = asyncio.Event()
        entry = (hold, released)
        self._holds.append(entry)
        try:
            try:
                async with asyncio.timeout(timeout):
                    while self._busy(hold):
                        self._changed.clear()
                        await self._changed.wait()
            except TimeoutError:
                raise ErasureRefusedError(
                    f"{len(self._busy(hold))} conversation(s) on {hold.channel} were still "
                    f"busy after {timeout:g} s") from None
            yield
        finally:
            self._holds.remove(entry)
            released.set()

    async def drop(self, sessions: Collection[str]) -> int:
        """Close the open copies of these sessions (see the Holder contract)."""
        wanted = set(sessions)
        return await self.registry.close_where(lambda conv: conv.session_id in wanted)
