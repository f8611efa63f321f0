"""The in-memory deduplicator: one process, bounded by count and age."""

from __future__ import annotations

import time
from collections import OrderedDict


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

    def close(self) -> None:
        return None
