"""The usage ledger in Redis, shared by every worker (see :class:`gateway.edge.ledger.UsageLedger`).

Keys (under ``GATEWAY_REDIS_PREFIX``)::

    {p}usage:<day>:<scope>   hash: calls, tokens, cost (HINCRBY / HINCRBYFLOAT), kept 3 days
    {p}rate:<scope>          sorted set of message times (a sliding window, one Lua script)

A Redis outage never stops a conversation: a count that cannot be written is dropped (logged
once per outage), and a budget that cannot be read lets the message through.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.edge.episodes import Episode
from gateway.edge.ledger import NOTHING, Spent
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


class RedisLedger:
    """See the module docstring."""

    def __init__(self, url: str, prefix: str) -> None:
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=5.0)
        self._prefix = prefix
        self._down = Episode(log, "the usage ledger in Redis")
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisLedger(prefix={self._prefix!r})"  # never the URL: it may hold a password

    def _key(self, day: str, scope: str) -> str:
        return f"{self._prefix}usage:{day}:{scope}"

    async def add(self, scopes: Sequence[str], day: str, tokens: int, cost_usd: float) -> None:
        try:
            async with bounded():
                pipe = self._redis.pipeline(transaction=False)
                for scope in scopes:
                    key = self._key(day, scope)
                    pipe.hincrby(key, "calls", 1)
                    pipe.hincrby(key, "tokens", tokens)
                    pipe.hincrbyfloat(key, "cost", cost_usd)
                    pipe.expire(key, KEEP_DAYS)
                await pipe.execute()
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
        if self._closed:
            return
        self._closed = True
        await self._redis.aclose()
