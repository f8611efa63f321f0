"""The PostgreSQL store: seq integrity, fencing, failures, import, schema versions."""

from __future__ import annotations

import asyncio
import threading

import asyncpg
import orjson
import pytest

from sessions.errors import (
    SessionExistsError,
    SessionNotFoundError,
    SessionReadError,
    SessionWriteError,
    StaleWriterError,
)
from sessions.persist import persist_call
from sessions.postgres import schema as pg_schema
from sessions.postgres.store import PostgresSessionStore, StoreUnavailableError, redact_url
from sessions.replay import replay_bytes
from sessions.replay_json import replay_json
from tests.sessions.helpers import PROMPT_A, SEED_DIR, add, assistant, call_request, user
from tests.sessions.pg import PG_URL, connect, fresh_schema
from tests.waiting import until

pytestmark = pytest.mark.services

SEEDS = ["v1-messages-only.jsonl", "v2-prompt-timeline.jsonl", "v2-no-prompts.jsonl",
         "v2-late-prompt-torn-tail.jsonl"]


async def insert_line(schema: str, seq: int, line: bytes) -> None:
    """Insert one entry row behind the store's back (another writer gone wrong)."""
    conn = await connect()
    try:
        await conn.execute(
            f"INSERT INTO {pg_schema.quoted(schema)}.entries (tenant, session_id, seq, type, line)"
            " VALUES ('default', 's1', $1, 'message', $2)", seq, line)
    finally:
        await conn.close()


def seqs(data: bytes) -> list[int]:
    return [orjson.loads(line)["seq"] for line in data.splitlines()]


def committed_elsewhere(schema: str, session_id: str, expected: list[int]) -> None:
    """Block the calling thread (and so its event loop) until another connection sees the
    session's log at ``expected`` seqs: what the server committed, whoever has read it."""

    async def seen() -> None:
        other = await PostgresSessionStore.connect(PG_URL, schema=schema)
        try:
            async def there() -> bool:
                return seqs(await other.read_log("default", session_id)) == expected

            await until(there, what=f"seqs {expected} committed")
        finally:
            await other.aclose()

    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(seen())
        except BaseException as exc:  # raised again in the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=run, name="committed-elsewhere")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]


class LockedEntries:
    """A connection in a thread of its own holding the entries table locked until released.

    :meth:`release_and_wait` blocks the calling thread (and so its event loop) while the lock
    goes: whatever waited behind it at the server commits with this loop unable to read its
    reply."""

    def __init__(self, schema: str) -> None:
        self._schema = schema
        self._locked = threading.Event()
        self._release = threading.Event()
        self._failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="locked-entries")

    def start(self) -> None:
        self._thread.start()
        if not self._locked.wait(60) or self._failed:
            raise self._failed[0] if self._failed else TimeoutError("no table lock in 60 s")

    def release_and_wait(self) -> None:
        self._release.set()
        self._thread.join()
        if self._failed:
            raise self._failed[0]

    def _run(self) -> None:
        async def hold() -> None:
            conn = await connect()
            try:
                async with conn.transaction():
                    await conn.execute(f"LOCK TABLE {pg_schema.quoted(self._schema)}.entries"
                                       " IN EXCLUSIVE MODE")
                    self._locked.set()
                    await asyncio.to_thread(self._release.wait)
            finally:
                await conn.close()

        try:
            asyncio.run(hold())
        except BaseException as exc:  # raised again in the caller's thread
            self._failed.append(exc)
            self._locked.set()


async def waiting_on_a_lock(conn: asyncpg.Connection, schema: str) -> bool:
    """Whether an append to ``schema``'s log is waiting at the server for a lock."""
    count = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE '%' || $1 || '%append_entries%'", pg_schema.quoted(schema))
    return bool(count)


# -- seq integrity -------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 3])
async def test_duplicate_or_gap_seq_is_refused(
    pg_store: PostgresSessionStore, pg_schema_name: str, offset: int
) -> None:
    """A row at the next seq (duplicate) or past it (gap) makes the append fail: SEQ_CONFLICT."""
    writer = await pg_store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("hello"))
    foreign = b'{"type":"message","seq":%d,"message":{"role":"user","content":"x"}}' % (
        2 + offset)
    await insert_line(pg_schema_name, 2 + offset, foreign)
    with pytest.raises(SessionWriteError) as info:
        await add(writer, user("mine"))
    assert info.value.kind == "SEQ_CONFLICT"
    with pytest.raises(SessionWriteError, match="SEQ_CONFLICT"):
        await add(writer, user("again"))  # the writer gave up: nothing lands after a conflict
    await writer.aclose()
    assert seqs(await pg_store.read_log("default", "s1")) == [0, 1, 2 + offset]


async def test_append_function_refuses_a_batch_not_starting_at_the_next_seq(
    pg_store: PostgresSessionStore, pg_schema_name: str
) -> None:
    """append_entries() writes nothing for a batch that would leave a gap or repeat a seq."""
    writer = await pg_store.create(channel="console", conversation="c", session_id="s1")
    await writer.aclose()
    conn = await connect()
    try:
        sql = (f"SELECT status, cur_next FROM {pg_schema.quoted(pg_schema_name)}.append_entries("
               "'default', 's1', 1, $1, ARRAY['message'], ARRAY[$2::bytea], 1, NULL)")
        results = [tuple(await conn.fetchrow(sql, first, b'{"type":"message"}') or ())
                   for first in (0, 2, 1)]
    finally:
        await conn.close()
    assert results == [("seq", 1), ("seq", 1), ("ok", 2)]


# -- fencing -------------------------------------------------------------------------------------


async def test_create_takes_the_given_fence_or_a_fresh_one_from_the_sequence(
        pg_store: PostgresSessionStore) -> None:
    """A writer holds the fence it was created with; without one, the next token of the
    sequence (taken in the statement that writes the header)."""
    given = await pg_store.create(channel="console", conversation="c", session_id="s1", fence=7)
    fresh = await pg_store.create(channel="console", conversation="d", session_id="s2")
    after = await pg_store.create(channel="console", conversation="d", session_id="s3")
    assert given.fence == 7
    assert 1 <= fresh.fence < after.fence
    await add(given, user("fenced at 7"))  # appends check the stored fence
    await add(after, user("fresh"))
    for writer in (given, fresh, after):
        await writer.aclose()


async def test_second_open_fences_out_the_first_writer(pg_store: PostgresSessionStore) -> None:
    """open() takes the session over: the first writer's appends raise StaleWriterError."""
    first = await pg_store.create(channel="console", conversation="c", session_id="s1")
    await add(first, user("from first"))
    second = await pg_store.open("default", "s1")
    with pytest.raises(StaleWriterError) as info:
        await add(first, user("late"))
    assert (info.value.token, info.value.current, info.value.kind) == (1, 2, "STALE_FENCE")
    with pytest.raises(StaleWriterError):
        await persist_call(first, call_request(PROMPT_A, ((0, 1),)))
    await add(second, assistant("from second"))
    await first.aclose()
    await second.aclose()
    replay = replay_bytes(await pg_store.read_log("default", "s1"))
    assert list(replay.messages) == [user("from first"), assistant("from second")]
    assert replay.problems == ()


async def test_explicit_fence_token_from_a_lease(pg_store: PostgresSessionStore) -> None:
    """open(fence=N) sets the token; a lower token is stale and changes nothing."""
    writer = await pg_store.create(channel="console", conversation="c", session_id="s1",
                                   fence=7)
    assert writer.fence == 7
    with pytest.raises(StaleWriterError) as info:
        await pg_store.open("default", "s1", fence=6)
    assert (info.value.token, info.value.current) == (6, 7)
    await add(writer, user("still mine"))  # the refused open did not fence the holder out
    same = await pg_store.open("default", "s1", fence=7)  # the lease holder re-opening
    newer = await pg_store.open("default", "s1", fence=9)
    with pytest.raises(StaleWriterError):
        await add(same, user("stale"))
    await add(newer, user("newest"))
    for w in (writer, same, newer):
        await w.aclose()
    with pytest.raises(ValueError, match="fencing token"):
        await pg_store.open("default", "s1", fence=0)
    page = await pg_store.message_page("default", "s1")
    assert [m["message"] for m in page.messages] == [user("still mine"), user("newest")]


async def test_refence_moves_only_the_conversations_latest_session(
        pg_store: PostgresSessionStore) -> None:
    """refence(latest_of=C) moves the latest session of C to the newer token in one
    statement and returns its next seq; once a newer session exists (``/new`` on another
    worker) it changes nothing and returns None; a newer token is stale; a deleted session is
    not found."""
    first = await pg_store.create(channel="web", conversation="web:c", fence=5)
    await add(first, user("hi"))
    assert await pg_store.refence("default", first.session_id, 8, latest_of="web:c") == 2
    with pytest.raises(StaleWriterError):
        await pg_store.refence("default", first.session_id, 7, latest_of="web:c")
    second = await pg_store.create(channel="web", conversation="web:c", fence=9)
    assert await pg_store.refence("default", first.session_id, 10, latest_of="web:c") is None
    writer = await pg_store.open("default", first.session_id, fence=8)  # still at 8
    await add(writer, user("the same holder writes on"))
    assert await pg_store.refence("default", second.session_id, 11, latest_of="web:c") == 1
    await pg_store.erase("default", [second.session_id], {"type": "erasure"})
    with pytest.raises(SessionNotFoundError):
        await pg_store.refence("default", second.session_id, 12, latest_of="web:c")


# -- failures ------------------------------------------------------------------------------------


async def test_failed_append_is_kept_and_written_ahead_of_the_next(
    pg_store: PostgresSessionStore, pg_schema_name: str
) -> None:
    """A refused append raises (kind = SQLSTATE); its entries, seq and ts kept, go in next."""
    writer = await pg_store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("one"))
    q = pg_schema.quoted(pg_schema_name)
    conn = await connect()
    try:
        # A real server-side failure: a trigger refusing every insert, then dropped.
        await conn.execute(
            f"CREATE FUNCTION {q}.refuse() RETURNS trigger LANGUAGE plpgsql AS"
            " $$BEGIN RAISE EXCEPTION 'disk on fire' USING ERRCODE = '53100'; END$$;"
            f" CREATE TRIGGER refuse BEFORE INSERT ON {q}.entries"
            f" FOR EACH ROW EXECUTE FUNCTION {q}.refuse()")
        with pytest.raises(SessionWriteError) as info:
            await add(writer, user("two"))
        pending = writer.pending_bytes
        await conn.execute(f"DROP TRIGGER refuse ON {q}.entries")
    finally:
        await conn.close()
    await add(writer, user("three"))
    await writer.aclose()
    data = await pg_store.read_log("default", "s1")
    assert (info.value.kind, pending > 0, writer.pending_bytes) == ("53100", True, 0)
    assert "two" not in str(info.value)
    assert seqs(data) == [0, 1, 2, 3]
    assert list(replay_bytes(data).messages) == [user("one"), user("two"), user("three")]
    two, three = (orjson.loads(line) for line in data.splitlines()[2:])
    assert two["ts"] <= three["ts"]


async def test_lost_reply_is_recognised_on_retry(pg_store: PostgresSessionStore) -> None:
    """An append committed but cancelled before its reply was read is not written twice."""
    writer = await pg_store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("one"))
    # The append is held at the server behind a table lock taken by another thread's
    # connection, so it is surely sent and its reply surely not read yet; that thread then
    # lets it commit while this loop is blocked (joined), and the reply waits unread.
    held = LockedEntries(pg_store.schema)
    held.start()
    task = asyncio.create_task(add(writer, user("two")))
    watcher = await connect()
    try:
        await until(lambda: waiting_on_a_lock(watcher, pg_store.schema),
                    what="the append waiting behind the lock")
    finally:
        await watcher.close()
    held.release_and_wait()  # blocks this loop until the server has committed the append
    committed_elsewhere(pg_store.schema, "s1", [0, 1, 2])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    committed = await pg_store.read_log("default", "s1")
    assert (seqs(committed), writer.pending_bytes > 0) == ([0, 1, 2], True)
    await add(writer, user("three"))
    await writer.aclose()
    data = await pg_store.read_log("default", "s1")
    assert seqs(data) == [0, 1, 2, 3]
    assert list(replay_bytes(data).messages) == [user("one"), user("two"), user("three")]


async def test_close_sends_what_a_failure_left_pending(
    pg_store: PostgresSessionStore, pg_schema_name: str
) -> None:
    """aclose() writes the entries an earlier failure left pending; then appends are refused."""
    writer = await pg_store.create(channel="console", conversation="c", session_id="s1")
    q = pg_schema.quoted(pg_schema_name)
    conn = await connect()
    try:
        await conn.execute(f"ALTER TABLE {q}.entries ADD CONSTRAINT no_bye"
                           " CHECK (position('bye'::bytea IN line) = 0)")
        with pytest.raises(SessionWriteError) as info:
            await add(writer, user("bye"))
        await conn.execute(f"ALTER TABLE {q}.entries DROP CONSTRAINT no_bye")
    finally:
        await conn.close()
    await writer.aclose()
    await writer.aclose()
    with pytest.raises(SessionWriteError, match="CLOSED"):
        await add(writer, user("after"))
    assert info.value.kind == "23514"
    assert list(replay_bytes(await pg_store.read_log("default", "s1")).messages) == [user("bye")]


async def test_unreachable_database_errors_never_show_the_password() -> None:
    """No server: reads raise StoreUnavailableError, writes SessionWriteError(CONNECTION)."""
    url = "postgresql://gw:hunter2secret@127.0.0.1:1/test"
    store = PostgresSessionStore(url, connect_timeout=2)
    with pytest.raises(StoreUnavailableError) as read:
        await store.read_log("default", "s1")
    with pytest.raises(SessionWriteError) as write:
        await store.create(channel="console", conversation="c", session_id="s1")
    await store.aclose()
    await store.aclose()
    assert (read.value.kind, write.value.kind) == ("CONNECTION", "CONNECTION")
    texts = [str(read.value), str(write.value), repr(store), redact_url(url)]
    assert [t for t in texts if "hunter2secret" in t] == []
    assert redact_url(url) == "postgresql://gw:***@127.0.0.1:1/test"


async def test_store_refuses_an_old_schema() -> None:
    """A schema below the latest version is refused with the command that fixes it."""
    async with fresh_schema(migrate=False) as name:
        with pytest.raises(pg_schema.SchemaVersionError, match="run `gateway db upgrade`"):
            await PostgresSessionStore.connect(PG_URL, schema=name)
        conn = await connect()
        try:
            assert await pg_schema.upgrade(conn, name) == (0, pg_schema.LATEST)
        finally:
            await conn.close()
        async with PostgresSessionStore(PG_URL, schema=name) as store:
            assert await store.list_sessions() == []


async def test_concurrent_upgrades_do_not_race() -> None:
    """Several workers upgrading a fresh schema at once all succeed; one of them migrates."""
    async with fresh_schema(migrate=False) as name:
        conns = [await connect() for _ in range(4)]
        try:
            results = await asyncio.gather(*(pg_schema.upgrade(c, name) for c in conns))
            applied = await pg_schema.applied(conns[0], name)
        finally:
            for conn in conns:
                await conn.close()
    latest = pg_schema.LATEST
    assert sorted(results) == [(0, latest)] + [(latest, latest)] * 3
    assert [(v, d) for v, d, _ in applied] == [(m.version, m.description)
                                               for m in pg_schema.MIGRATIONS]


async def test_upgrade_from_version_1_adds_the_blob_table() -> None:
    """A schema made by the first release (sessions only) upgrades to blobs and tombstones,
    keeping its sessions."""
    async with fresh_schema(migrate=False) as name:
        conn = await connect()
        try:
            q = pg_schema.quoted(name)
            await conn.execute(f"CREATE SCHEMA {q}")
            await conn.execute(f"CREATE TABLE {q}.schema_version (version integer PRIMARY KEY,"
                               " description text NOT NULL,"
                               " applied_at timestamptz NOT NULL DEFAULT now())")
            first = pg_schema.MIGRATIONS[0]
            await conn.execute(pg_schema.render(first.sql, name))
            await conn.execute(f"INSERT INTO {q}.schema_version VALUES (1, $1)", first.description)
            await conn.execute(f"INSERT INTO {q}.sessions (tenant, id, header) VALUES"
                               " ('default', 's1', '{}')")
            assert await pg_schema.upgrade(conn, name) == (1, pg_schema.LATEST)
            assert await conn.fetchval(f"SELECT count(*) FROM {q}.sessions") == 1
            assert await conn.fetchval(f"SELECT count(*) FROM {q}.blobs") == 0
            assert await conn.fetchval(f"SELECT count(*) FROM {q}.erasures") == 0
        finally:
            await conn.close()


async def test_newer_schema_is_refused() -> None:
    """A schema from a newer gateway is refused by the store and by upgrade."""
    async with fresh_schema() as name:
        conn = await connect()
        try:
            await conn.execute(f"INSERT INTO {pg_schema.quoted(name)}.schema_version"
                               " (version, description) VALUES (99, 'future')")
            with pytest.raises(pg_schema.SchemaVersionError, match="newer"):
                await pg_schema.upgrade(conn, name)
        finally:
            await conn.close()
        with pytest.raises(pg_schema.SchemaVersionError, match="newer"):
            await PostgresSessionStore.connect(PG_URL, schema=name)


# -- import --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SEEDS)
async def test_seed_import_replays_like_the_file(pg_store: PostgresSessionStore, name: str) -> None:
    """v1/v2 seed logs import line for line; their replay equals the file's (torn tail aside)."""
    data = (SEED_DIR / name).read_bytes()
    result = await pg_store.import_log("default", data)
    stored = await pg_store.read_log("default", result.session_id)
    kept = data[: len(data) - result.torn_bytes]
    assert stored == kept
    from_file, from_db = replay_json(replay_bytes(data)), replay_json(replay_bytes(stored))
    assert from_file.pop("tornTail") == (result.torn_bytes > 0)
    assert from_db.pop("tornTail") is False
    assert from_db == from_file
    info = {i.session_id: i for i in await pg_store.list_sessions("default")}[result.session_id]
    assert (info.version, info.size_bytes) == (orjson.loads(data.splitlines()[0]).get("version"),
                                                len(kept))


async def test_imported_old_format_is_not_resumed(pg_store: PostgresSessionStore) -> None:
    """A v2 import cannot be opened for writing, and importing it twice is refused."""
    data = (SEED_DIR / "v2-no-prompts.jsonl").read_bytes()
    result = await pg_store.import_log("default", data)
    with pytest.raises(SessionReadError, match="version 2"):
        await pg_store.open("default", result.session_id)
    with pytest.raises(SessionExistsError):
        await pg_store.import_log("default", data)


async def test_imported_v3_log_can_be_resumed(pg_store: PostgresSessionStore) -> None:
    """A v3 log from the JSONL store imports with its seqs and resumes where it ended."""
    writer = await pg_store.create(channel="console", conversation="c", session_id="orig")
    await add(writer, user("hi"))
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),)))
    await writer.aclose()
    data = await pg_store.read_log("default", "orig")
    result = await pg_store.import_log("acme", data, session_id="copy")
    resumed = await pg_store.open("acme", "copy")
    assert (resumed.state.next_seq, resumed.state.call_count) == (result.entries, 1)
    await add(resumed, assistant("hello"))
    await resumed.aclose()
    assert replay_bytes(await pg_store.read_log("acme", "copy")).problems == ()
