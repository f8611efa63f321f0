"""Admin sign-outs shared by the workers through their Redis (:class:`SignOuts`).

One key per ended sign-in, ``{p}admin-signout:<sign-in id>``, expiring when its cookie does
(``EXAT``), so the set cleans itself. Every worker looks the key up for each request a login
cookie lets in (one ``EXISTS``; the token and the loopback viewer need none).

This process's own sign-outs are also kept in memory (checked first): Redis away, a sign-out
taken here still holds here, and the others refuse every login cookie (503,
:class:`SignOutsUnavailableError`) rather than let in one that may have been signed out.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.edge.signouts import SignOuts, SignOutsUnavailableError
from gateway.edge.tasks import bounded

log = logging.getLogger(__name__)


class RedisSignOuts:
    """See the module docstring; ``local`` is this process's set (kept in memory)."""

    def __init__(self, url: str, prefix: str, local: SignOuts) -> None:
        # Not decoded: only EXISTS and SET are sent, nothing is read back.
        self._redis: aioredis.Redis = aioredis.Redis.from_url(url, socket_connect_timeout=5.0)
        self._prefix = prefix
        self._local = local
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisSignOuts(prefix={self._prefix!r})"  # never the URL: it may hold a password

    def _key(self, sign_in: str) -> str:
        return f"{self._prefix}admin-signout:{sign_in}"

    async def revoke(self, sign_in: str, until: float) -> None:
        await self._local.revoke(sign_in, until)
        try:
            async with bounded():
                await self._redis.set(self._key(sign_in), b"1", exat=int(until) + 1)
        except (RedisError, TimeoutError) as exc:
            log.warning("admin: a sign-out could not be shared with the other workers (%s); "
                        "it holds on this one", type(exc).__name__)

    async def revoked(self, sign_in: str) -> bool:
        if await self._local.revoked(sign_in):
            return True
        try:
            async with bounded():
                return bool(await self._redis.exists(self._key(sign_in)))
        except (RedisError, TimeoutError) as exc:
            raise SignOutsUnavailableError(type(exc).__name__) from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._redis.aclose()
