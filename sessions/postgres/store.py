"""The PostgreSQL session store: the logs of :mod:`sessions.jsonl`, one table row per line.

Each entry is stored as the exact line the JSONL writer writes (same orjson encoding, same key
order: ``type``, ``seq``, ``ts``, then the body) in ``entries.line``, with ``seq`` and ``type``
beside it for queries. :meth:`PostgresSessionStore.read_log` joins the lines in ``seq`` order,
so replay, drift and export read a database session exactly as they read a file, and a session
exported as JSONL replays the same. Tables and migrations: :mod:`sessions.postgres.schema`.

**Sequence numbers.** Every append is one call of the SQL function ``append_entries()``: in one
statement it locks the session row and inserts the batch only if it starts right after the
last stored ``seq``; the primary key ``(tenant, session_id, seq)`` refuses duplicates too. A gap
or a duplicate is never accepted: the append raises ``SessionWriteError(kind="SEQ_CONFLICT")``.

**One writer per session, by fencing.** Each session row carries a ``fence`` token, and every
token comes from one PostgreSQL sequence (``fences``), so a token is never handed out twice
and never goes back, even when whatever hands out leases (Redis) loses its state.
``open()`` takes a fresh one (``fence=None``) or the one the caller brings (``fence=N``: a
lease's token, from :meth:`PostgresSessionStore.next_fence`; a token below the current one
raises :class:`~sessions.errors.StaleWriterError`, an equal one is the same holder
re-opening). :meth:`PostgresSessionStore.refence` moves a session on to a newer token without
reading it again, for a holder whose cached copy is still the log. The writer sends its token
with every append; once another ``open()`` has superseded it, its appends raise
:class:`~sessions.errors.StaleWriterError`. So, unlike the JSONL store's
``flock``, a second ``open()`` does not fail: it takes the session over, and the old writer
finds out at its next append, with nothing of it written after the takeover.

**Durability.** An append returns once PostgreSQL has committed it (durable with the server's
default ``synchronous_commit``); :meth:`PostgresSessionWriter.sync` has nothing left to do.

**Failures.** Per the writer contract, entries are accepted (``seq`` given, state advanced)
before they are sent; if the database cannot be reached (``kind="CONNECTION"``) or refuses
(``kind`` = the SQLSTATE), they are kept and sent, with their original ``seq`` and ``ts``,
ahead of the next append. A retry after a lost reply (committed, but the answer never came) is
recognised by comparing the stored lines, so it is not reported as a conflict. Reads that
cannot reach the database raise :class:`StoreUnavailableError`.

The URL may hold a password: it is never logged or put in an error; ``repr`` redacts it.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import orjson

from sessions import entries
from sessions.encoding import loads_entry
from sessions.errors import (
    SessionError,
    SessionExistsError,
    SessionNotFoundError,
    SessionReadError,
    SessionWriteError,
    StaleWriterError,
)
from sessions.names import (
    DEFAULT_TENANT,
    create_with_fresh_id,
    new_session_id,
    utc_iso,
    validate_session_id,
    validate_tenant,
)
from sessions.order import GENERATION, newest_first
from sessions.postgres import schema as pg_schema
from sessions.postgres.importer import (
    ImportPlan,
    ImportResult,
    header_id,
    plan_import,
)
from sessions.postgres.maintenance import insert_imported, prune_rows, rewrite_lines
from sessions.postgres.pool import POOL_SIZE, open_pool
from sessions.postgres.writer import DB_ERRORS, PostgresSessionWriter, error_kind
from sessions.scan import SCHEDULED_MARK, recover_state
from sessions.store import Cutoffs, MessagePage, Pruned, SessionInfo, SessionState, page_item
from sessions.tombstones import decode_lines, encode

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

__all__ = [
    "ImportPlan",
    "ImportResult",
    "PostgresSessionStore",
    "PostgresSessionWriter",
    "StoreUnavailableError",
    "plan_import",
    "redact_url",
]

CLOSE_TIMEOUT = 10.0
"""Seconds :meth:`PostgresSessionStore.aclose` waits for busy connections before cutting them."""
_GENERATION = (  # a header's generation as sessions.order reads it: 0 unless a whole number > 0
    f"CASE WHEN jsonb_typeof(header->'{GENERATION}') = 'number' AND header->>'{GENERATION}'"
    f" ~ '^[1-9][0-9]{{0,17}}$' THEN (header->>'{GENERATION}')::bigint ELSE 0 END"
)
_NEWEST = (f" ORDER BY {_GENERATION} DESC, started_at COLLATE \"C\" DESC,"
           ' id COLLATE "C" DESC')
"""A conversation's sessions, newest first, as the JSONL store orders them."""


class StoreUnavailableError(SessionError, OSError):
    """A read could not be served: the database is unreachable or failed the query.

    ``kind`` is ``CONNECTION`` or the SQLSTATE, as for :class:`SessionWriteError`.
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(errno.EIO, f"session database unavailable ({kind}): {detail}")
        self.kind = kind

    def __str__(self) -> str:
        return str(self.strerror)


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and reprs)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
    except ValueError:
        return "<unparsable database URL>"


class PostgresSessionStore:
    """Sessions in PostgreSQL. See :class:`sessions.store.SessionStore` and the module doc.

    The connection pool is made on first use (or by :meth:`connect`), and the schema version
    is checked then: a schema other than :data:`sessions.postgres.schema.LATEST` raises
    :class:`~sessions.postgres.schema.SchemaVersionError` telling to run ``gateway db upgrade``.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = pg_schema.DEFAULT_SCHEMA,
        min_size: int = 1,
        max_size: int = POOL_SIZE,
        connect_timeout: float = 10.0,
        statement_cache: bool = True,
        command_timeout: float | None = 30.0,
        new_id: Callable[[], str] = new_session_id,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``new_id`` draws the ids of sessions created without one (tests force collisions).
        ``clock``: the Unix time entries are stamped with (``ts``, a header's ``startedAt``).
        ``statement_cache=False``: no prepared statements kept per connection, for a server
        reached through PgBouncer in transaction mode (a statement prepared on one server
        connection is not there on the next)."""
        self._url = url
        self.new_id = new_id
        self._clock = clock
        self.schema = pg_schema.validate_schema(schema)
        self._pool_args: dict[str, Any] = {
            "min_size": min(min_size, max_size), "max_size": max_size,
            "connect_timeout": connect_timeout, "command_timeout": command_timeout,
            "statement_cache": statement_cache,
        }
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._pool_lock = asyncio.Lock()
        self._closed = False
        self._q = pg_schema.quoted(schema)

    @classmethod
    async def connect(cls, url: str, **options: Any) -> PostgresSessionStore:
        """A store whose pool is open and whose schema version was checked."""
        store = cls(url, **options)
        await store.connect_pool()
        return store

    async def connect_pool(self) -> None:
        """Open the pool and check the schema now rather than on first use."""
        try:
            await self.pool()
        except SessionError:
            raise
        except DB_ERRORS as exc:
            raise StoreUnavailableError(error_kind(exc), type(exc).__name__) from exc

    async def __aenter__(self) -> PostgresSessionStore:
        await self.connect_pool()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def quoted_schema(self) -> str:
        """The schema as a quoted SQL identifier (for tables beside the sessions: blobs)."""
        return self._q

    def __repr__(self) -> str:
        return f"PostgresSessionStore({redact_url(self._url)!r}, schema={self.schema!r})"

    async def pool(self) -> asyncpg.Pool[asyncpg.Record]:
        """The connection pool, made (and the schema checked) on first use."""
        if self._pool is not None:
            return self._pool
        async with self._pool_lock:
            if self._closed:
                raise StoreUnavailableError("CLOSED", "the store is closed")
            if self._pool is None:
                self._pool = await open_pool(self._url, self.schema, **self._pool_args)
        return self._pool

    def connection(self) -> AbstractAsyncContextManager[PoolConnectionProxy[asyncpg.Record]]:
        """A pooled connection for the store's own tables (inbox, blobs); database failures
        raise :class:`StoreUnavailableError`."""
        return self._reading()

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[PoolConnectionProxy[asyncpg.Record]]:
        try:
            pool = await self.pool()
            async with pool.acquire() as conn:
                yield conn
        except SessionError:
            raise  # ours (not found, exists, stale...), though some are OSErrors too
        except DB_ERRORS as exc:
            raise StoreUnavailableError(error_kind(exc), type(exc).__name__) from exc

    @asynccontextmanager
    async def _writing(self, session_id: str) -> AsyncIterator[PoolConnectionProxy[asyncpg.Record]]:
        try:
            pool = await self.pool()
            async with pool.acquire() as conn:
                yield conn
        except SessionError:
            raise  # ours (not found, exists, stale...), though some are OSErrors too
        except DB_ERRORS as exc:
            raise SessionWriteError(session_id, error_kind(exc), type(exc).__name__) from exc

    # -- writers -----------------------------------------------------------------------------

    def _writer(self, sid: str, tenant: str, state: SessionState,
                fence: int) -> PostgresSessionWriter:
        return PostgresSessionWriter(self.pool, self._q, sid, tenant, state, fence,
                                     clock=self._clock)

    async def create(
        self,
        *,
        tenant: str = DEFAULT_TENANT,
        channel: str,
        conversation: str,
        session_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
        fence: int | None = None,
    ) -> PostgresSessionWriter:
        """Start a session (header row written) whose writer holds ``fence`` (default: a
        fresh token from the sequence)."""
        validate_tenant(tenant)
        if session_id is None:
            return await create_with_fresh_id(
                lambda sid: self._create(validate_session_id(sid), tenant, channel,
                                         conversation, extra, fence), self.new_id)
        return await self._create(validate_session_id(session_id), tenant, channel,
                                  conversation, extra, fence)

    async def _create(self, sid: str, tenant: str, channel: str, conversation: str,
                      extra: Mapping[str, Any] | None,
                      fence: int | None) -> PostgresSessionWriter:
        wanted = None if fence is None else _token(fence)
        async with self._writing(sid) as conn, conn.transaction():
            # The creations of one conversation take turns, on every worker: each counts on
            # from the latest session the one before committed (sessions.order). (A tenant
            # name holds no '/'; the schema is in the text for pg_stat_activity.)
            await conn.execute(f"SELECT pg_advisory_xact_lock(hashtextextended("
                               f"'{self.schema}.sessions/' || $1, 0))", f"{tenant}/{conversation}")
            latest = await conn.fetchval(
                f"SELECT max({_GENERATION}) FROM {self._q}.sessions"
                " WHERE tenant = $1 AND conversation = $2", tenant, conversation)
            now = utc_iso(self._clock())
            head = entries.header(sid, now, tenant=tenant, channel=channel,
                                  conversation=conversation, generation=int(latest or 0) + 1,
                                  extra=extra)
            line = entries.encode_line(head, 0, now)
            try:
                # The header row and line in one statement; without a given fence, a fresh
                # token from the sequence, in the same round trip.
                token = int(await conn.fetchval(
                    f"WITH s AS (INSERT INTO {self._q}.sessions (tenant, id, started_at,"
                    " channel, conversation, version, header, fence, next_seq, size_bytes)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb,"
                    f" COALESCE($8::bigint, nextval('{self._q}.fences')), 1, $9)"
                    " RETURNING tenant, id, fence),"
                    f" e AS (INSERT INTO {self._q}.entries (tenant, session_id, seq, type, line)"
                    " SELECT tenant, id, 0, 'session', $10 FROM s)"
                    " SELECT fence FROM s",
                    tenant, sid, head["startedAt"], channel, conversation,
                    entries.FORMAT_VERSION, line.decode(), wanted, len(line) + 1, line,
                ))
            except asyncpg.UniqueViolationError as exc:
                raise SessionExistsError(f"session {sid} already exists") from exc
        return self._writer(sid, tenant, SessionState(next_seq=1), token)

    async def open(
        self, tenant: str, session_id: str, fence: int | None = None
    ) -> PostgresSessionWriter:
        """Take over a session for appending; every earlier writer becomes stale.

        ``fence=None`` gives the session a fresh token from the sequence. ``fence=N`` (a
        lease's fencing token) sets it to ``N``; ``N`` below the current token raises
        :class:`~sessions.errors.StaleWriterError` and changes nothing.
        """
        validate_tenant(tenant)
        validate_session_id(session_id)
        wanted = None if fence is None else _token(fence)
        async with self._writing(session_id) as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT version, fence, next_seq, message_count FROM {self._q}.sessions"
                " WHERE tenant = $1 AND id = $2 FOR UPDATE",
                tenant, session_id,
            )
            if row is None:
                raise SessionNotFoundError(f"no session {session_id!r} for tenant {tenant!r}")
            if row["version"] != entries.FORMAT_VERSION:
                raise SessionReadError(
                    f"session {session_id} is format version {row['version']}; only version "
                    f"{entries.FORMAT_VERSION} sessions can be resumed for writing"
                )
            current = int(row["fence"])
            if wanted is not None and wanted < current:
                raise StaleWriterError(session_id, wanted, current)
            token = wanted if wanted is not None else int(await conn.fetchval(
                f"SELECT setval('{self._q}.fences', greatest(nextval('{self._q}.fences'), $1))",
                current + 1))
            await conn.execute(
                f"UPDATE {self._q}.sessions SET fence = $3 WHERE tenant = $1 AND id = $2",
                tenant, session_id, token,
            )
            # Messages only count; the rest (sections, prompts, tools, calls) rebuilds state.
            lines = await conn.fetch(
                f"SELECT line FROM {self._q}.entries WHERE tenant = $1 AND session_id = $2"
                " AND type IS DISTINCT FROM 'message' ORDER BY seq",
                tenant, session_id,
            )
        state = recover_state([bytes(r["line"]) for r in lines])
        state.next_seq = int(row["next_seq"])
        state.message_count = int(row["message_count"])
        return self._writer(session_id, tenant, state, token)

    async def next_fence(self, at_least: int = 0) -> int:
        """A fresh fencing token: greater than every token handed out before (and than
        ``at_least``). Raises :class:`StoreUnavailableError` when the database is away."""
        async with self._reading() as conn:
            token = await conn.fetchval(
                f"SELECT setval('{self._q}.fences', greatest(nextval('{self._q}.fences'), $1))",
                at_least)
        return int(token)

    async def refence(self, tenant: str, session_id: str, fence: int, *,
                      latest_of: str | None = None) -> int | None:
        """Move a session on to the newer token ``fence`` without reading it; returns the
        session's ``next_seq`` (so the caller can tell whether its copy is still the log).
        Raises :class:`~sessions.errors.StaleWriterError` when the session holds a newer one.
        ``latest_of``: only while it is still that conversation's latest session (checked in
        the same statement); ``None`` (nothing changed) when it is not.
        """
        token = _token(fence)
        extra: tuple[str, ...] = ()
        latest = "true"
        if latest_of is not None:
            extra = (latest_of,)
            latest = (f"id = (SELECT id FROM {self._q}.sessions WHERE tenant = $1"
                      f" AND conversation = $3 AND started_at IS NOT NULL{_NEWEST} LIMIT 1)")
        async with self._writing(session_id) as conn:
            row = await conn.fetchrow(
                f"WITH old AS (SELECT fence FROM {self._q}.sessions"
                f" WHERE tenant = $1 AND id = $2 AND {latest} FOR UPDATE)"
                f" UPDATE {self._q}.sessions s SET fence = ${2 + len(extra) + 1} FROM old"
                f" WHERE s.tenant = $1 AND s.id = $2 AND old.fence <= ${2 + len(extra) + 1}"
                " RETURNING s.next_seq", tenant, session_id, *extra, token)
            if row is None:  # why not (rare: another worker wrote, rotated or erased)
                found = await conn.fetchrow(
                    f"SELECT fence, {latest} AS latest FROM {self._q}.sessions"
                    " WHERE tenant = $1 AND id = $2", tenant, session_id, *extra)
                if found is None:
                    raise SessionNotFoundError(
                        f"no session {session_id!r} for tenant {tenant!r}")
                if not found["latest"]:
                    return None  # not the conversation's latest session any more
                raise StaleWriterError(session_id, token, int(found["fence"]))
        return int(row["next_seq"])

    async def import_log(
        self,
        tenant: str,
        data: bytes,
        *,
        session_id: str | None = None,
        fallback_id: str | None = None,
    ) -> ImportResult:
        """Store a JSONL log (any format version) line for line; see :func:`plan_import`.

        The session id is ``session_id``, else the header's ``id`` if it is a valid name, else
        ``fallback_id`` (a file name, say). Imported sessions have fence 0, so any ``open()``
        takes them over.
        """
        validate_tenant(tenant)
        plan = plan_import(data)
        head = plan.header
        sid = validate_session_id(session_id if session_id is not None
                                  else header_id(head, fallback_id))
        version = head.get("version") if isinstance(head.get("version"), int) else None
        async with self._writing(sid) as conn, conn.transaction():
            await insert_imported(conn, self._q, self.schema, tenant, sid, version, plan)
        return ImportResult(sid, tenant, version, len(plan.rows), plan.size, len(plan.torn))

    # -- readers -----------------------------------------------------------------------------

    async def exists(self, tenant: str, session_id: str) -> bool:
        validate_tenant(tenant)
        validate_session_id(session_id)
        async with self._reading() as conn:
            found = await conn.fetchval(
                f"SELECT EXISTS (SELECT 1 FROM {self._q}.sessions WHERE tenant = $1 AND id = $2)",
                tenant, session_id,
            )
        return bool(found)

    async def latest_session(self, tenant: str, conversation: str) -> str | None:
        validate_tenant(tenant)
        async with self._reading() as conn:
            found = await conn.fetchval(
                f"SELECT id FROM {self._q}.sessions WHERE tenant = $1 AND conversation = $2"
                f" AND started_at IS NOT NULL{_NEWEST} LIMIT 1",
                tenant, conversation,
            )
        return None if found is None else str(found)

    async def log_mark(self, tenant: str, conversation: str) -> tuple[str, int] | None:
        """The conversation's latest session and its next seq, or ``None`` (one small read:
        whether anything was appended since a look before)."""
        validate_tenant(tenant)
        async with self._reading() as conn:
            row = await conn.fetchrow(
                f"SELECT id, next_seq FROM {self._q}.sessions WHERE tenant = $1"
                f" AND conversation = $2 AND started_at IS NOT NULL{_NEWEST} LIMIT 1",
                tenant, conversation)
        return None if row is None else (str(row["id"]), int(row["next_seq"]))

    async def list_sessions(self, tenant: str | None = None) -> list[SessionInfo]:
        if tenant is not None:
            validate_tenant(tenant)
        async with self._reading() as conn:
            rows = await conn.fetch(
                "SELECT tenant, id, started_at, channel, conversation, version, message_count,"
                " first_user_text, size_bytes, extract(epoch FROM modified_at)::float8 AS mtime,"
                " CASE WHEN jsonb_typeof(header->'scope') = 'object'"
                " THEN (header->'scope')::text END AS scope,"
                f" {_GENERATION} AS generation,"
                # Scheduled turns: message lines whose meta names a schedule (see
                # sessions.scan.SCHEDULED_MARK), over the index of message entries.
                f" (SELECT count(*) FROM {self._q}.entries e WHERE e.tenant = s.tenant"
                "  AND e.session_id = s.id AND e.type = 'message'"
                "  AND position($2::bytea IN e.line) > 0) AS scheduled"
                f" FROM {self._q}.sessions s WHERE $1::text IS NULL OR tenant = $1"
                " ORDER BY coalesce(started_at, '') COLLATE \"C\" DESC, modified_at DESC",
                tenant, SCHEDULED_MARK,
            )
        return newest_first([
            SessionInfo(
                session_id=r["id"], tenant=r["tenant"], started_at=r["started_at"],
                channel=r["channel"], conversation=r["conversation"], version=r["version"],
                message_count=int(r["message_count"]), first_user_text=r["first_user_text"],
                size_bytes=int(r["size_bytes"]), modified=float(r["mtime"]),
                scope=None if r["scope"] is None else orjson.loads(r["scope"]),
                generation=int(r["generation"]), scheduled=int(r["scheduled"]),
            )
            for r in rows
        ])

    async def read_log(self, tenant: str, session_id: str) -> bytes:
        validate_tenant(tenant)
        validate_session_id(session_id)
        async with self._reading() as conn:
            data = await conn.fetchval(
                "SELECT string_agg(line || '\\x0a'::bytea, ''::bytea ORDER BY seq)"
                f" FROM {self._q}.entries WHERE tenant = $1 AND session_id = $2",
                tenant, session_id,
            )
        if data is None:  # every session has its header row
            raise SessionNotFoundError(f"no session {session_id!r} for tenant {tenant!r}")
        return bytes(data)

    async def message_page(
        self, tenant: str, session_id: str, offset: int = 0, limit: int = 50
    ) -> MessagePage:
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must be >= 0")
        validate_tenant(tenant)
        validate_session_id(session_id)
        async with self._reading() as conn, conn.transaction(isolation="repeatable_read",
                                                             readonly=True):
            total = await conn.fetchval(
                f"SELECT message_count FROM {self._q}.sessions WHERE tenant = $1 AND id = $2",
                tenant, session_id,
            )
            if total is None:
                raise SessionNotFoundError(f"no session {session_id!r} for tenant {tenant!r}")
            rows = await conn.fetch(
                f"SELECT line FROM {self._q}.entries WHERE tenant = $1 AND session_id = $2"
                " AND type = 'message' ORDER BY seq OFFSET $3 LIMIT $4",
                tenant, session_id, offset, limit,
            )
        messages: list[dict[str, Any]] = []
        for r in rows:
            messages.append(page_item(loads_entry(r["line"]) or {}))
        return MessagePage(session_id=session_id, total=int(total), offset=offset,
                           messages=tuple(messages))

    # -- erasure -----------------------------------------------------------------------------

    async def erase(self, tenant: str, session_ids: Sequence[str],
                    tombstone: Mapping[str, Any],
                    rewrites: Mapping[str, Mapping[int, bytes]] | None = None) -> list[str]:
        """See :meth:`sessions.store.SessionStore.erase`: one transaction. A writer still
        holding one of these sessions finds it gone at its next append (``NOT_FOUND``); the
        rewritten lines keep their ``seq``, so a writer of such a session appends as before."""
        validate_tenant(tenant)
        ids = [validate_session_id(sid) for sid in session_ids]
        changed = {validate_session_id(sid): dict(lines)
                   for sid, lines in (rewrites or {}).items()}
        line = encode(tombstone)
        async with self._writing(ids[0] if ids else "erasure") as conn, conn.transaction():
            for sid, lines in changed.items():
                if sid not in ids:
                    await rewrite_lines(conn, self._q, tenant, sid, lines)
            rows = await conn.fetch(
                f"DELETE FROM {self._q}.sessions WHERE tenant = $1 AND id = ANY($2::text[])"
                " RETURNING id", tenant, ids,
            )
            await conn.execute(f"INSERT INTO {self._q}.erasures (tenant, line) VALUES ($1, $2)",
                               tenant, line)
        deleted = {str(r["id"]) for r in rows}
        return [sid for sid in ids if sid in deleted]

    async def tombstones(self, tenant: str | None = None) -> list[dict[str, Any]]:
        if tenant is not None:
            validate_tenant(tenant)
        async with self._reading() as conn:
            rows = await conn.fetch(
                f"SELECT line FROM {self._q}.erasures WHERE $1::text IS NULL OR tenant = $1"
                " ORDER BY id", tenant,
            )
        return decode_lines(b"\n".join(bytes(r["line"]) for r in rows))

    async def prune(self, cutoffs: Cutoffs, *, dry: bool = False) -> list[Pruned]:
        """See :meth:`sessions.store.SessionStore.prune` (:func:`prune_rows`)."""
        async with self._writing("retention") as conn:
            return await prune_rows(conn, self._q, cutoffs, dry=dry)

    async def aclose(self) -> None:
        """Close the pool (idempotent); connections still busy after a grace are cut."""
        async with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT)
        except TimeoutError:
            pool.terminate()


def _token(fence: object) -> int:
    if not isinstance(fence, int) or isinstance(fence, bool) or fence < 1:
        raise ValueError("a fencing token is an int >= 1")
    return fence

