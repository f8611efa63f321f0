"""Leader election through Redis, for jobs only one worker may run (a bot's long poll).

A worker campaigns with ``SET {p}leader:<job> <owner> NX PX ttl`` every ``ttl/3`` or so.
The winner runs the job and extends its lease every ``ttl/3`` (compare-and-extend); it stops
the job once the last confirmed extension is ``LEASE_SAFETY * ttl`` old, which is before the
key can expire in Redis, so an old leader has stopped before a new one can be elected. When
the leader dies its key lapses and the next campaign wins; a leader that is shut down gives
the key up at once (compare-and-delete).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from coordination import scripts
from coordination.redis_queue import LEASE_SAFETY
from gateway.edge.tasks import bounded, stop

log = logging.getLogger(__name__)

RESTART_PAUSE = 1.0
"""Seconds before campaigning again after the job itself failed."""


class RedisLeaderElector:
    """See :class:`gateway.edge.coordination.LeaderElector`."""

    def __init__(self, redis: aioredis.Redis, key: str, owner: str, *, ttl: float,
                 name: str) -> None:
        self._redis = redis
        self.key = key
        self.owner = owner
        self.ttl = ttl
        self.name = name
        self._ttl_ms = max(1, int(ttl * 1000))
        self._extend = redis.register_script(scripts.EXTEND)
        self._resign = redis.register_script(scripts.RELEASE_LEASE)
        self._leader = False
        self.terms = 0
        """How many times this worker has been elected (for health and tests)."""

    @property
    def is_leader(self) -> bool:
        return self._leader

    async def lead(self, job: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            if not await self._campaign():
                await asyncio.sleep(self.ttl / 3 * random.uniform(0.5, 1.5))
                continue
            self.terms += 1
            log.info("coordination: this worker now leads %s", self.name)
            try:
                failed = await self._serve(job, asked)
            finally:
                self._leader = False
                await self._step_down()
            if failed:
                await asyncio.sleep(RESTART_PAUSE)

    async def _campaign(self) -> bool:
        try:
            async with bounded():
                return bool(await self._redis.set(self.key, self.owner, nx=True,
                                                  px=self._ttl_ms))
        except (RedisError, TimeoutError) as exc:
            log.warning("coordination: campaign for %s failed (%s)", self.name,
                        type(exc).__name__)
            return False

    async def _serve(self, job: Callable[[], Awaitable[None]], asked: float) -> bool:
        """Run ``job`` while the lease holds; True when the job itself failed."""
        loop = asyncio.get_running_loop()
        self._leader = True
        deadline = asked + self.ttl * LEASE_SAFETY

        async def run() -> None:
            await job()

        task = asyncio.create_task(run(), name=f"leader:{self.name}")
        try:
            while True:
                wait = min(self.ttl / 3, deadline - loop.time())
                if wait <= 0:
                    log.warning("coordination: could not confirm leadership of %s; stepping "
                                "down", self.name)
                    return False
                await asyncio.wait([task], timeout=wait)
                if task.done():
                    if not task.cancelled() and task.exception() is not None:
                        log.error("coordination: %s stopped (%s)", self.name,
                                  type(task.exception()).__name__)
                        return True
                    return False
                asked = loop.time()
                try:
                    async with bounded():
                        extended = int(await self._extend(keys=[self.key],
                                                          args=[self.owner, self._ttl_ms]))
                except (RedisError, TimeoutError) as exc:
                    log.warning("coordination: renewing leadership of %s failed (%s)",
                                self.name, type(exc).__name__)
                    continue
                if not extended:
                    log.warning("coordination: lost leadership of %s", self.name)
                    return False
                deadline = asked + self.ttl * LEASE_SAFETY
        finally:
            await stop(task)

    async def _step_down(self) -> None:
        try:
            async with bounded():
                await self._resign(keys=[self.key], args=[self.owner])
        except (RedisError, TimeoutError) as exc:  # it lapses by itself
            log.warning("coordination: giving up %s failed (%s)", self.name, type(exc).__name__)
