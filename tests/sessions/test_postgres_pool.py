"""The PostgreSQL store's pool: no reset round trip when a connection comes back, and why
that is safe (no session state is ever left on a connection), a cut-off transaction still
rolled back, and the warning when the server has no room for the pool."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest

from sessions.postgres.blobs import PostgresBlobStore
from sessions.postgres.inbox import PostgresInbox
from sessions.postgres.store import PostgresSessionStore
from tests.sessions.pg import PG_URL, connect, fresh_schema

MARK = "SELECT 'gateway pool test marker'::text"


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


async def last_statement(pid: int) -> str:
    admin = await connect()
    try:
        return str(await admin.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1",
                                        pid))
    finally:
        await admin.close()


async def test_a_connection_comes_back_to_the_pool_without_a_round_trip(schema: str) -> None:
    """The last statement the server saw on a released connection is the caller's own: the
    pool sent no reset query (asyncpg's default sends one on every release)."""
    async with PostgresSessionStore(PG_URL, schema=schema, max_size=1) as store:
        async with store.connection() as conn:
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            await conn.fetchval(MARK)
        assert await last_statement(pid) == MARK
        async with store.connection() as conn:  # and it is the same connection, reused
            assert await conn.fetchval("SELECT pg_backend_pid()") == pid


async def session_state(conn: asyncpg.Connection[asyncpg.Record] | object) -> dict[str, object]:
    """What a connection carries beyond its statements: settings, listens, advisory locks,
    cursors, SQL-prepared statements, temporary tables, an open transaction."""
    fetch = conn.fetch  # type: ignore[attr-defined]
    fetchval = conn.fetchval  # type: ignore[attr-defined]
    return {
        # What RESET ALL would change back (values, not sources: asyncpg's own type
        # introspection turns jit off and sets it back to what it was).
        "settings": sorted((r["name"], r["setting"]) for r in await fetch(
            "SELECT name, setting FROM pg_settings WHERE setting IS DISTINCT FROM reset_val")),
        "listening": [r[0] for r in await fetch("SELECT pg_listening_channels()")],
        "advisory locks": await fetchval("SELECT count(*) FROM pg_locks WHERE locktype ="
                                         " 'advisory' AND pid = pg_backend_pid()"),
        "cursors": await fetchval("SELECT count(*) FROM pg_cursors"),
        "prepared by SQL": await fetchval("SELECT count(*) FROM pg_prepared_statements"
                                          " WHERE from_sql"),
        "temporary schema": await fetchval("SELECT pg_my_temp_schema() <> 0"),
        "in a transaction": conn.is_in_transaction(),  # type: ignore[attr-defined]
    }


async def exercise(store: PostgresSessionStore) -> None:
    """Every kind of statement the store, its inbox and its blobs send, several at once."""
    inbox = PostgresInbox(store)
    blobs = PostgresBlobStore(store)

    async def one_conversation(n: int) -> None:
        writer = await store.create(channel="web", conversation=f"web:c{n}")
        await writer.append([{"type": "message", "message": {"role": "user",
                                                             "content": f"hi {n}"}}])
        await store.open("default", writer.session_id, fence=writer.fence + 1000)
        await store.refence("default", writer.session_id, writer.fence + 2000)
        await store.read_log("default", writer.session_id)
        await store.message_page("default", writer.session_id)
        await store.latest_session("default", f"web:c{n}")
        await inbox.enter("default", f"c{n}", f"item{n}", f"dedup{n}", "body")
        await inbox.enter("default", f"c{n}", f"again{n}", f"dedup{n}", "body")  # duplicate
        await inbox.head("default", f"c{n}")
        await inbox.answered(f"item{n}", writer.session_id)
        await inbox.has_owed("default", f"c{n}")
        await inbox.status(f"item{n}")
        await inbox.next_fence()
        digest = await blobs.put("default", f"blob {n}".encode())
        await blobs.get_many("default", [digest])

    await asyncio.gather(*(one_conversation(n) for n in range(6)))
    await store.list_sessions()
    await inbox.owed_conversations()
    await inbox.prune(0)
    doomed = await store.create(channel="web", conversation="web:gone")
    await store.erase("default", [doomed.session_id], {"type": "erasure", "counts": {}})
    await store.tombstones()
    await blobs.list_blobs("default")


async def test_connections_keep_no_session_state_after_every_kind_of_use(schema: str) -> None:
    """Why skipping the reset is safe: after the store has run each kind of statement it has,
    on several connections at once, every pooled connection carries exactly what a fresh
    connection carries (no setting, listen, advisory lock, cursor, prepared statement,
    temporary table or open transaction)."""
    fresh = await asyncpg.connect(PG_URL)
    try:
        expected = await session_state(fresh)
    finally:
        await fresh.close()
    async with PostgresSessionStore(PG_URL, schema=schema, max_size=3) as store:
        await exercise(store)
        pool = await store.pool()
        held = [await pool.acquire() for _ in range(3)]  # every connection of the pool
        try:
            states = [await session_state(conn) for conn in held]
        finally:
            for conn in held:
                await pool.release(conn)
    assert states == [expected] * 3


async def test_a_transaction_cut_off_is_rolled_back_before_the_connection_is_reused(
        schema: str, caplog: pytest.LogCaptureFixture) -> None:
    """A task cancelled inside a transaction it opened by hand leaves nothing behind: the
    next user of the connection is outside any transaction, and the row is not there."""
    async with PostgresSessionStore(PG_URL, schema=schema, max_size=1) as store:
        inside = asyncio.Event()

        async def cut_off() -> None:
            async with store.connection() as conn:
                await conn.execute("BEGIN")
                await conn.execute(f"INSERT INTO {store.quoted_schema}.inbox (tenant,"
                                   " conversation, item, body) VALUES ('default', 'c', 'x', 'b')")
                inside.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(cut_off())
        await inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with caplog.at_level(logging.ERROR, logger="asyncio"):  # asyncpg says it rolled back
            async with store.connection() as conn:
                assert not conn.is_in_transaction()
                assert await conn.fetchval(
                    f"SELECT count(*) FROM {store.quoted_schema}.inbox") == 0


async def test_a_server_without_room_for_the_pool_is_named_in_one_warning(
        schema: str, caplog: pytest.LogCaptureFixture) -> None:
    """A pool that may open more connections than the server has free warns once, naming
    the setting to change; one that fits says nothing."""
    admin = await connect()
    try:
        limit = int(await admin.fetchval("SHOW max_connections"))
    finally:
        await admin.close()
    with caplog.at_level(logging.WARNING, logger="sessions.postgres.pool"):
        async with PostgresSessionStore(PG_URL, schema=schema, max_size=2):
            pass
        assert not [r for r in caplog.records if "free connections" in r.getMessage()]
        async with PostgresSessionStore(PG_URL, schema=schema, max_size=limit + 10):
            pass
    warned = [r.getMessage() for r in caplog.records if "free connections" in r.getMessage()]
    assert len(warned) == 1
    assert "GATEWAY_STORE_POOL_SIZE" in warned[0]
