"""PostgreSQL for tests: a throw-away, migrated schema per test in database ``test``.

The server is ``GATEWAY_TEST_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
Schema names are random, so tests running side by side (pytest-xdist workers, other
checkouts) never meet. When the server cannot be reached the test is skipped with the reason,
or fails instead in CI (:mod:`tests.capabilities`), so a missing service never passes silently.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NoReturn

import asyncpg

from sessions.postgres import schema as pg_schema
from tests.capabilities import missing

PG_URL = os.environ.get("GATEWAY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")

_unreachable: list[str] = []  # the first failure's reason, so later tests do not wait again


def unavailable(reason: str) -> NoReturn:
    """Skip (or, in CI, fail) because PostgreSQL is not there."""
    missing(f"PostgreSQL not reachable at {PG_URL}: {reason}")


async def connect() -> asyncpg.Connection[asyncpg.Record]:
    """An admin connection to the test database, or skip/fail saying why there is none."""
    if _unreachable:
        unavailable(_unreachable[0])
    try:
        return await asyncpg.connect(PG_URL, timeout=5)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        _unreachable.append(f"{type(exc).__name__}: {exc}")
        unavailable(_unreachable[0])


async def create_schema(*, migrate: bool = True) -> str:
    """A new schema name ``gw_test_<random>``, migrated (so created) unless ``migrate=False``."""
    conn = await connect()
    name = f"gw_test_{secrets.token_hex(5)}"
    try:
        if migrate:
            await pg_schema.upgrade(conn, name)
    finally:
        await conn.close()
    return name


async def drop_schema(name: str) -> None:
    conn = await connect()
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {pg_schema.quoted(name)} CASCADE")
    finally:
        await conn.close()


@asynccontextmanager
async def fresh_schema(*, migrate: bool = True) -> AsyncIterator[str]:
    """:func:`create_schema`, dropped again on exit."""
    name = await create_schema(migrate=migrate)
    try:
        yield name
    finally:
        await drop_schema(name)
