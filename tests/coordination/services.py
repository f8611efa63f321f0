"""Redis and PostgreSQL for the coordination tests: a throw-away namespace in each.

Redis is ``GATEWAY_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``); every test gets its
own key prefix ``gwtest:<uuid>:`` and its keys are deleted afterwards, so tests running side
by side (pytest-xdist workers, other checkouts) never see each other's keys. PostgreSQL is the
sessions tests' server (:mod:`tests.sessions.pg`), with a migrated schema per test. When a
server cannot be reached the test is skipped with the reason, or fails instead in CI
(:mod:`tests.capabilities`), so a missing service never passes silently there.
"""

from __future__ import annotations

import os
import uuid
from typing import NoReturn

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tests.capabilities import missing

REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

_unreachable: list[str] = []


def unavailable(reason: str) -> NoReturn:
    missing(f"Redis not reachable at {REDIS_URL}: {reason}")


async def redis_client() -> aioredis.Redis:
    """A client of the test Redis, or skip/fail saying why there is none."""
    if _unreachable:
        unavailable(_unreachable[0])
    client: aioredis.Redis = aioredis.Redis.from_url(REDIS_URL, decode_responses=True,
                                                     socket_connect_timeout=2)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        _unreachable.append(f"{type(exc).__name__}: {exc}")
        unavailable(_unreachable[0])
    return client


def new_prefix() -> str:
    return f"gwtest:{uuid.uuid4().hex}:"


async def delete_prefix(client: aioredis.Redis, prefix: str) -> None:
    """Delete every key under ``prefix`` (the test's namespace)."""
    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
    for start in range(0, len(keys), 500):
        await client.delete(*keys[start:start + 500])
