"""The usage ledger in Redis, shared by every worker (see :class:`gateway.edge.ledger.UsageLedger`).

Keys (under ``GATEWAY_REDIS_PREFIX``)::

    {p}usage:<day>:<scope>   hash: calls, tokens, cost (HINCRBY / HINCRBYFLOAT), kept 3 days
    {p}rate:<scope>          sorted set of message times (a sliding window, one Lua script)

A Redis outage never stops a conversation: a count that cannot be written is dropped (logged
once per outage), and a budget that cannot be read lets the message through.

**Counts are written together.** A call's counts go to three scopes (tenant, chat, person),
four commands each: twelve commands a message. Instead, every count added while a write is
on its way waits for the next write (a group commit: one at low load, fewer than one a call
under load), the counts of each key are summed first, and each key is one script call
(:data:`_ADD`: the three increments and the expiry) in one pipeline: one round trip, a
command per key. ``add`` still returns once its count is written (or dropped), so a budget
read after it sees it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from coordination.scripts import run_many
from gateway.edge.episodes import Episode
from gateway.edge.ledger import NOTHING, Spent, tenant_of
from gateway.edge.tasks import bounded

log = logging.getLogger(__name__)

KEEP_DAYS = 3 * 86_400
# Drop what left the window; if the window is full, the seconds until its oldest leaves;
# else add this message. One script, so two workers never both take the last place.
_HIT = """
local key, now, window, limit, member = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]),
    tonumber(ARGV[3]), ARGV[4]
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
if redis.call('ZCARD', key) >= limit then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return tostring(tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', key, now, member)
redis.call('PEXPIRE', key, math.ceil(window * 1000))
return '0'
"""


# KEYS: one usage hash; ARGV: calls, tokens, cost, seconds to keep it. The counts of every
# call added meanwhile, summed, in one command (see the module docstring).
_ADD = """
redis.call('HINCRBY', KEYS[1], 'calls', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[2])
redis.call('HINCRBYFLOAT', KEYS[1], 'cost', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


class RedisLedger:
    """See the module docstring."""

    def __init__(self, url: str, prefix: str,
                 keep: Callable[[str], float] | None = None) -> None:
        """``keep``: seconds a tenant's totals are kept (at most :data:`KEEP_DAYS`: the
        retention of ``GATEWAY_RETENTION_DAYS`` when shorter)."""
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=5.0)
        self._prefix = prefix
        self._down = Episode(log, "the usage ledger in Redis")
        self._closed = False
        self._add = self._redis.register_script(_ADD)
        self._keep = keep or (lambda tenant: KEEP_DAYS)
        self._waiting: dict[str, list[float]] = {}  # key -> [calls, tokens, cost] not written
        self._written: asyncio.Future[None] | None = None  # the write the waiting ones join
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"RedisLedger(prefix={self._prefix!r})"  # never the URL: it may hold a password

    def _key(self, day: str, scope: str) -> str:
        return f"{self._prefix}usage:{day}:{scope}"

    async def add(self, scopes: Sequence[str], day: str, tokens: int, cost_usd: float) -> None:
        if self._closed:
            return  # the gateway stops: nothing is counted after the ledger closed
        for scope in scopes:
            totals = self._waiting.get(self._key(day, scope))
            if totals is None:
                keep = min(KEEP_DAYS, max(1, int(self._keep(tenant_of(scope)))))
                totals = self._waiting[self._key(day, scope)] = [0, 0, 0.0, keep]
            totals[0] += 1
            totals[1] += tokens
            totals[2] += cost_usd
        if self._written is None:
            self._written = asyncio.get_running_loop().create_future()
        written = self._written
        self._wake.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_forever(), name="usage-ledger")
        # shield: a caller cancelled while it waits must not cancel the write others share
        await asyncio.shield(written)

    async def _write_forever(self) -> None:
        """The one writer: each round writes every count added since the last (its task is
        the ledger's, stopped by :meth:`aclose`)."""
        while not self._closed or self._written is not None:
            await self._wake.wait()
            self._wake.clear()
            await self._write_waiting()

    async def _write_waiting(self) -> None:
        if self._written is None:
            return
        batch, self._waiting = self._waiting, {}
        done, self._written = self._written, None
        try:
            await self._write(batch)
        finally:
            done.set_result(None)

    async def _write(self, batch: dict[str, list[float]]) -> None:
        try:
            async with bounded():
                await run_many(self._redis, self._add, [
                    ([key], [int(calls), int(tokens), repr(cost), int(keep)])
                    for key, (calls, tokens, cost, keep) in batch.items()])
            self._down.ok()
        except (RedisError, TimeoutError) as exc:
            self._down.failed(type(exc).__name__)

    async def spent(self, scope: str, day: str) -> Spent:
        try:
            async with bounded():
                found = await self._redis.hgetall(self._key(day, scope))
            self._down.ok()
        except (RedisError, TimeoutError) as exc:
            self._down.failed(type(exc).__name__)
            return NOTHING
        if not found:
            return NOTHING
        return Spent(int(found.get("calls", 0)), int(found.get("tokens", 0)),
                     float(found.get("cost", 0.0)))

    async def hit(self, scope: str, now: float, limit: int, window: float) -> float:
        member = f"{now:.6f}:{secrets.token_hex(4)}"  # two messages in one instant both count
        try:
            async with bounded():
                wait = await self._redis.eval(
                    _HIT, 1, f"{self._prefix}rate:{scope}", now, window, limit, member)
            self._down.ok()
        except (RedisError, TimeoutError) as exc:
            self._down.failed(type(exc).__name__)
            return 0.0
        return max(0.0, float(wait))

    async def aclose(self) -> None:
        """Write what is still waiting, stop the writer, close the connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._writer is not None:
                self._wake.set()  # the writer writes what waits, then ends (each write is
                await self._writer  # bounded), rather than be cut off mid-write
        finally:
            await self._redis.aclose()
