"""The PostgreSQL store's connection pool: how big, how a connection comes back, whether the
server has room for it.

**Size.** One store (one worker) opens at most :data:`POOL_SIZE` connections by default
(``GATEWAY_STORE_POOL_SIZE``). A message costs a handful of short statements (``bench/
RESULTS.md``, "Round trips"), so a few connections carry hundreds of messages a second, and
every worker's pool together must stay under the server's ``max_connections``. When the
pool is opened, a server that has fewer free connections than the pool may take is named in
one warning.

**No reset.** asyncpg's default reset sends ``SELECT pg_advisory_unlock_all(); CLOSE ALL;
UNLISTEN *; RESET ALL`` each time a connection comes back to the pool: one round trip, half
of a worker's round trips before this. Here it has nothing to undo (:func:`keep_session_state`).

**PgBouncer** in transaction mode: ``statement_cache=False`` (``GATEWAY_STORE_PGBOUNCER``)
keeps no prepared statements per connection, since the next transaction may run on another
server connection; the store's statements need nothing else of a session.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

from sessions.postgres import schema as pg_schema

log = logging.getLogger(__name__)

POOL_SIZE = 5
"""Connections one store opens at most, by default (see the module docstring)."""


async def keep_session_state(conn: object) -> None:
    """The pool's reset when a connection comes back: nothing, so no round trip.

    Safe because the store's statements never change the session: no ``SET``, no
    ``LISTEN``, only transaction-scoped advisory locks (``pg_advisory_xact_lock``), no cursors
    outside a transaction, no temporary tables, no SQL ``PREPARE`` (asyncpg's own prepared
    statements are its statement cache, which its default reset keeps as well).
    ``tests/sessions/test_postgres_pool.py`` checks every pooled connection after every kind
    of use. A transaction left open (a task cancelled inside one) is still rolled back:
    asyncpg does that itself before it calls this.
    """


async def open_pool(url: str, schema: str, *, min_size: int, max_size: int,
                    connect_timeout: float, command_timeout: float | None,
                    statement_cache: bool = True) -> asyncpg.Pool[asyncpg.Record]:
    """A pool whose schema is at the version this code needs (else
    :class:`~sessions.postgres.schema.SchemaVersionError`)."""
    options: dict[str, Any] = {"min_size": min_size, "max_size": max_size,
                               "timeout": connect_timeout,
                               "command_timeout": command_timeout,
                               "reset": keep_session_state}
    if not statement_cache:
        options["statement_cache_size"] = 0
    pool: asyncpg.Pool[asyncpg.Record] = await asyncpg.create_pool(url, **options)
    try:
        async with pool.acquire() as conn:
            await pg_schema.check(conn, schema)
            if statement_cache:  # behind PgBouncer these are the pooler's figures, not ours
                await _room_for(conn, max_size)
    except BaseException:
        pool.terminate()  # nothing runs on it yet: no grace needed
        raise
    return pool


async def _room_for(conn: Any, wanted: int) -> None:
    """One warning when the server has fewer free connections than this pool may open."""
    row = await conn.fetchrow(
        "SELECT current_setting('max_connections')::int AS max,"
        " current_setting('superuser_reserved_connections')::int AS reserved,"
        " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int"
        " AS used")
    free = int(row["max"]) - int(row["reserved"]) - int(row["used"])
    # This pool's first connection is counted in ``used`` already.
    if wanted - 1 > free:
        log.warning("the session database has %d free connections (max_connections %d, %d in "
                    "use) and this worker's pool may open %d more: lower "
                    "GATEWAY_STORE_POOL_SIZE or raise max_connections",
                    free, row["max"], row["used"], wanted - 1)
