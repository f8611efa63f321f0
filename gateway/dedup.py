"""Dropping duplicate deliveries by platform id, before they reach a session.

The seam is :class:`Deduplicator`; the in-memory one bounds itself by count and age, the file
one (:mod:`coordination.file_dedup`) survives restarts, and the Redis one is shared by workers.
"""

from __future__ import annotations

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

    def close(self) -> None:
        """Release what the backend holds (a file); idempotent, no-op for most."""
        ...
