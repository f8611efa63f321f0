"""Fixtures of the coordination tests: a Redis prefix and a PostgreSQL schema per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from sessions.postgres.store import PostgresSessionStore
from tests.coordination.private_services import PrivatePostgres
from tests.coordination.services import delete_prefix, new_prefix, redis_client
from tests.sessions.pg import PG_URL, fresh_schema


@pytest.fixture
async def redis() -> AsyncIterator[aioredis.Redis]:
    client = await redis_client()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def prefix(redis: aioredis.Redis) -> AsyncIterator[str]:
    """A fresh key prefix; its keys are deleted after the test."""
    name = new_prefix()
    try:
        yield name
    finally:
        await delete_prefix(redis, name)


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


@pytest.fixture
async def pg_store(schema: str) -> AsyncIterator[PostgresSessionStore]:
    store = await PostgresSessionStore.connect(PG_URL, schema=schema)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of the test module's own, started in a temporary directory (its
    tests stop and start it; the machine's server is never touched)."""
    server = PrivatePostgres()
    try:
        server.create()
        yield server
    finally:
        server.destroy()
