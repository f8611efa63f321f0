"""Platform-id deduplication shared by workers: one ``SET NX EX`` per id."""

from __future__ import annotations

import redis.asyncio as aioredis

from coordination.keys import Keys
from gateway.tasks import bounded

MIN_TTL = 3600.0
"""Slack retries for about an hour, so no shared dedup forgets sooner."""


class RedisDeduplicator:
    """See :class:`gateway.dedup.Deduplicator`: atomic across every worker on the Redis.

    Keys are ``{p}dedup:<namespace>:<id>`` and expire after ``ttl`` seconds (at least an hour).
    A Redis error (or TimeoutError) propagates: the caller cannot tell a duplicate, and must
    not guess.
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, namespace: str,
                 ttl: float = MIN_TTL) -> None:
        self._redis = redis
        self._keys = keys
        self.namespace = namespace
        self.ttl = max(int(ttl), int(MIN_TTL))

    async def first_time(self, key: str) -> bool:
        async with bounded():
            return bool(await self._redis.set(self._keys.dedup(self.namespace, key), "1",
                                              nx=True, ex=self.ttl))

    async def keep(self, key: str) -> None:
        return None  # written by first_time already (shared by workers, it cannot wait)

    def close(self) -> None:
        return None  # the coordinator owns the connection

    async def forget(self, key: str) -> None:
        """The delivery was not kept: let a redelivery through (on any worker)."""
        async with bounded():
            await self._redis.delete(self._keys.dedup(self.namespace, key))
