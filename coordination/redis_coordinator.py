"""Several gateway workers sharing one Redis (``GATEWAY_REDIS_URL``) and one PostgreSQL store.

Each worker is stateless apart from its in-flight turns: what is owed is queued in PostgreSQL
and conversations are leased in Redis (:mod:`.redis_queue`), replies to requests held by
another worker are relayed (:mod:`.relay`), pairing lives in one
key (:mod:`.redis_pairing`) and singleton jobs elect a leader (:mod:`.leader`). Key names:
:mod:`.keys`. The URL may hold a password: it is never logged or shown in a repr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Mapping
from typing import Any, Self

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from coordination.keys import DEFAULT_PREFIX, Keys
from coordination.leader import RedisLeaderElector
from coordination.redis_erasure import RedisErasureBus
from coordination.redis_pairing import RedisPairingState
from coordination.redis_queue import RedisConversations
from coordination.relay import Relay
from gateway.edge.coordination import SharedInbox
from gateway.edge.errors import ConfigError
from gateway.edge.pairing import PairingState
from gateway.edge.tasks import bounded, stop

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL = 15.0


def new_worker_id() -> str:
    """Unique per process start: ``w<pid>-<random>`` (the pid helps an operator find it)."""
    return f"w{os.getpid()}-{secrets.token_hex(4)}"


class RedisCoordinator:
    """See :class:`gateway.edge.coordination.Coordinator` and the module docstring."""

    def __init__(self, url: str, inbox: SharedInbox, *, prefix: str = DEFAULT_PREFIX,
                 lease_ttl: float = DEFAULT_LEASE_TTL, worker: str | None = None,
                 linger: float = 0.0) -> None:
        """``inbox``: the owed messages, kept with the sessions (PostgreSQL). ``linger``:
        seconds a lease is kept after its queue emptied, for the next message."""
        self._url = url
        self.keys = Keys(prefix)
        self.worker = worker or new_worker_id()
        self.lease_ttl = lease_ttl
        # No socket_timeout: commands are bounded by the callers (see .tasks.bounded).
        self.redis: aioredis.Redis = aioredis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=5.0, socket_keepalive=True,
            health_check_interval=30,
        )
        self.relay = Relay(self.redis, self.keys, self.worker)
        self.conversations = RedisConversations(self.redis, self.keys, self.worker, self.relay,
                                                inbox, lease_ttl=lease_ttl, linger=linger)
        self._electors: dict[str, RedisLeaderElector] = {}
        self._pairing: RedisPairingState | None = None
        self._bus: RedisErasureBus | None = None
        self._group: asyncio.TaskGroup | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisCoordinator(prefix={self.keys.prefix!r}, worker={self.worker!r})"

    async def __aenter__(self) -> Self:
        """Check Redis is there, then start the relay reader and the lease renewer."""
        try:
            async with bounded():
                await self.redis.ping()
        except (RedisError, TimeoutError) as exc:
            await self.redis.aclose()
            raise ConfigError(
                f"cannot reach Redis at GATEWAY_REDIS_URL ({type(exc).__name__})") from None
        await self._check_settings()
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        self._tasks = [self._group.create_task(self.relay.run(), name="relay"),
                       self._group.create_task(self.conversations.renew_forever(),
                                               name="lease-renewal")]
        log.info("coordination: worker %s on Redis (prefix %s, lease %.1f s)", self.worker,
                 self.keys.prefix, self.lease_ttl)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _check_settings(self) -> None:
        """One warning line when Redis may drop keys or lose them on a restart.

        Nothing acknowledged is lost either way (the queue is in PostgreSQL), but an evicted
        or forgotten lease lets a second worker start a conversation's turn while the first
        still runs one (the session store's fencing stops the loser), and a restart without
        persistence drops the relayed replies in flight and the pairing codes.
        """
        try:
            async with bounded():
                policy = (await self.redis.config_get("maxmemory-policy")).get(
                    "maxmemory-policy", "")
                aof = (await self.redis.config_get("appendonly")).get("appendonly", "")
                save = (await self.redis.config_get("save")).get("save", "")
        except (RedisError, TimeoutError) as exc:  # CONFIG may be disabled (managed Redis)
            log.warning("coordination: could not read Redis settings (%s); it needs "
                        "maxmemory-policy noeviction and AOF or RDB persistence",
                        type(exc).__name__)
            return
        problems = []
        if policy != "noeviction":
            problems.append(f"maxmemory-policy is {policy or 'unset'} (keys can be evicted;"
                            " set noeviction)")
        if aof != "yes" and not (save or "").strip():
            problems.append("no persistence (appendonly no, save \"\"): a restart loses "
                            "leases, pairing and relayed replies")
        if problems:
            log.warning("coordination: Redis %s", "; ".join(problems))

    async def aclose(self) -> None:
        """Stop the background tasks and close the connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            group, self._group = self._group, None
            if group is not None:
                for task in self._tasks:
                    await stop(task)
                await group.__aexit__(None, None, None)
        finally:
            if self._pairing is not None:
                self._pairing.close()
            await self.redis.aclose()

    def erasure_bus(self) -> RedisErasureBus:
        if self._bus is None:
            self._bus = RedisErasureBus(self.redis, self.keys, self.worker)
        return self._bus

    def elector(self, name: str) -> RedisLeaderElector:
        elector = self._electors.get(name)
        if elector is None:
            elector = RedisLeaderElector(self.redis, self.keys.leader(name), self.worker,
                                         ttl=self.lease_ttl, name=name)
            self._electors[name] = elector
        return elector

    def pairing_state(self) -> PairingState:
        if self._pairing is None:
            self._pairing = RedisPairingState(self._url, self.keys.pairing)
        return self._pairing

    def health(self) -> Mapping[str, Any]:
        return {
            "mode": "redis",
            "worker": self.worker,
            "serving": self.conversations.held,
            "leading": sorted(n for n, e in self._electors.items() if e.is_leader),
        }
