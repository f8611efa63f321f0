"""Dropping duplicate deliveries by platform id, before they reach a session.

The seam is :class:`Deduplicator`; the in-memory one bounds itself by count and age, the file
one (:mod:`gateway.dedup_file`) survives restarts, and the Redis one is shared by workers.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol


class Deduplicator(Protocol):
    """Contract: :meth:`first_time` returns True exactly once per key within ``ttl`` seconds
    (atomically, even under concurrent calls) and claims the key. The caller then settles the
    claim: :meth:`keep` once the message is recorded (a backend that survives restarts writes
    the key down only then, so a crash before the record leaves the redelivery to be taken),
    or :meth:`forget` when it was not kept (the delivery failed), so a redelivery is taken."""

    async def first_time(self, key: str) -> bool: ...

    async def keep(self, key: str) -> None: ...

    async def forget(self, key: str) -> None: ...


class MemoryDeduplicator:
    """Process-local, bounded by ``max_keys`` and ``ttl`` seconds."""

    def __init__(self, ttl: float = 3600.0, max_keys: int = 100_000) -> None:
        self.ttl = ttl
        self.max_keys = max_keys
        self._seen: OrderedDict[str, float] = OrderedDict()

    async def first_time(self, key: str) -> bool:
        now = time.monotonic()
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if now - at < self.ttl and len(self._seen) < self.max_keys:
                break
            del self._seen[oldest]
        if key in self._seen:
            return False
        self._seen[key] = now
        return True

    async def keep(self, key: str) -> None:
        return None  # remembered since first_time

    async def forget(self, key: str) -> None:
        self._seen.pop(key, None)
