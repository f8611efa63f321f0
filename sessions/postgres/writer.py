"""The writer of one PostgreSQL session: fenced, gap-free appends of accepted entries.

See :mod:`sessions.postgres.store` for the storage model. Each append is one call of the SQL
function ``append_entries()`` (:mod:`sessions.postgres.schema`), which checks the writer's
fencing token and that the batch starts right after the last stored ``seq``, all in one statement.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import asyncpg

from sessions import entries
from sessions.errors import SessionError, SessionWriteError, StaleWriterError
from sessions.names import utc_iso
from sessions.scan import message_text
from sessions.store import SessionState

log = logging.getLogger(__name__)

PoolSource: TypeAlias = "Callable[[], Awaitable[asyncpg.Pool[asyncpg.Record]]]"

MAX_BACKLOG_BYTES = 16 * 1024 * 1024
"""Accepted-but-unwritten bytes a writer holds while the database is away, before it gives up."""

CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
    # Raised when a connection left mid-operation (a query cancelled by a timeout while the
    # server went away) cannot be reset on its way back to the pool; the pool drops it. Not
    # translated, it escaped as a bug: the gateway apologised for messages it had not
    # recorded, and a writer that had accepted a batch was taken for one that refused it,
    # so the batch was written twice (the several-worker PostgreSQL outage trial).
    asyncpg.InternalClientError,
)
DB_ERRORS: tuple[type[Exception], ...] = (*CONNECTION_ERRORS, asyncpg.PostgresError)
"""What a database call can raise when the database is away or refuses."""




def error_kind(exc: BaseException) -> str:
    """``CONNECTION``, or the SQLSTATE of an error the server sent (or our error's kind)."""
    if isinstance(exc, SessionError):
        return str(getattr(exc, "kind", type(exc).__name__))
    if isinstance(exc, asyncpg.PostgresError) and not isinstance(
        exc, asyncpg.PostgresConnectionError
    ):
        return exc.sqlstate or "POSTGRES"
    return "CONNECTION"




def _user_text(item: Mapping[str, Any]) -> str | None:
    """What a listing shows as the first user text, if this entry is a user message with text."""
    if item.get("type") != "message":
        return None
    msg = item.get("message")
    if not isinstance(msg, dict) or msg.get("role") != "user":
        return None
    return message_text(msg.get("content"))


@dataclass(slots=True)
class Batch:
    """Accepted lines not yet committed, starting at ``first_seq``."""

    first_seq: int
    types: list[str | None] = field(default_factory=list)
    lines: list[bytes] = field(default_factory=list)
    messages: int = 0
    first_user_text: str | None = None

    @property
    def size(self) -> int:
        return sum(len(line) + 1 for line in self.lines)

    def extend(self, other: Batch) -> None:
        self.types.extend(other.types)
        self.lines.extend(other.lines)
        self.messages += other.messages
        if self.first_user_text is None:
            self.first_user_text = other.first_user_text


class PostgresSessionWriter:
    """Writer of one session, fenced by a token. See :class:`sessions.store.SessionWriter`."""

    def __init__(self, pool: PoolSource, schema_sql: str, session_id: str, tenant: str,
                 state: SessionState, fence: int,
                 clock: Callable[[], float] = time.time) -> None:
        """``pool`` gives the store's pool; ``schema_sql`` is the quoted schema name;
        ``clock`` what each entry's ``ts`` reads (the store's)."""
        self._pool = pool
        self._clock = clock
        self._sql_append = (
            f"SELECT status, cur_fence, cur_next FROM {schema_sql}.append_entries("
            "$1, $2, $3, $4, $5::text[], $6::bytea[], $7, $8)"
        )
        self._sql_landed = (
            f"SELECT line FROM {schema_sql}.entries WHERE tenant = $1 AND session_id = $2"
            " AND seq >= $3 AND seq < $4 ORDER BY seq"
        )
        self._session_id = session_id
        self._tenant = tenant
        self._state = state
        self._fence = fence
        self._pending: list[Batch] = []
        self._lock = asyncio.Lock()  # one append in flight: appends never interleave
        self._closed = False
        self._stale: int | None = None  # the fence that superseded ours
        self._broken: str | None = None  # a kind after which retrying cannot succeed

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def tenant(self) -> str:
        return self._tenant

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def fence(self) -> int:
        """The fencing token this writer sends with every append."""
        return self._fence

    @property
    def fenced_off(self) -> bool:
        """True once an append was refused because a newer token took the session over: the
        refused entries were dropped, but the state had counted them, so it is no longer the
        log's (and ``next_seq`` may agree with the log's by chance, when the new holder wrote
        as many). Such a writer is never refenced; the session is read again."""
        return self._stale is not None

    def refenced(self, fence: int) -> None:
        """The session was moved on to ``fence`` for this same holder (see
        :meth:`PostgresSessionStore.refence`): append under it from now on."""
        self._fence = fence
        self._stale = None

    @property
    def pending_bytes(self) -> int:
        """Bytes accepted but not yet committed because an earlier append failed."""
        return sum(batch.size for batch in self._pending)

    async def append(self, items: Sequence[Mapping[str, Any]]) -> int:
        if self._closed:
            raise SessionWriteError(self._session_id, "CLOSED", "writer is closed")
        if self._stale is not None:
            raise StaleWriterError(self._session_id, self._fence, self._stale)
        if self._broken is not None:
            raise SessionWriteError(self._session_id, self._broken, "writer gave up earlier")
        if not items:
            return 0
        ts = utc_iso(self._clock())
        batch = Batch(self._state.next_seq)
        for offset, item in enumerate(items):
            batch.lines.append(entries.encode_line(item, batch.first_seq + offset, ts))
            kind = item.get("type")
            batch.types.append(kind if isinstance(kind, str) else None)
            if kind == "message":
                batch.messages += 1
                if batch.first_user_text is None:
                    batch.first_user_text = _user_text(item)
        # Accepted before the write (see the SessionWriter contract): a failed batch is sent
        # again, with the same seq and ts, ahead of the next append.
        self._state.next_seq += len(items)
        for item in items:
            self._state.advance(item)
        self._pending.append(batch)
        await self._flush()
        return batch.size

    async def _flush(self) -> None:
        async with self._lock:
            while self._pending:  # empty already if an earlier caller's flush sent our batch
                count = len(self._pending)
                merged = Batch(self._pending[0].first_seq)
                for batch in self._pending[:count]:
                    merged.extend(batch)
                try:
                    status, current, next_seq = await self._send(merged)
                    if status == "seq":
                        landed = await self._landed(count)
                        if landed:
                            # An earlier try committed these batches; only its reply was lost.
                            del self._pending[:landed]
                            continue
                except asyncpg.UniqueViolationError as exc:
                    # A row was inserted behind the function's back after its check.
                    self._give_up("SEQ_CONFLICT")
                    raise SessionWriteError(self._session_id, "SEQ_CONFLICT",
                                            "a line with that seq already exists") from exc
                except DB_ERRORS as exc:
                    if self.pending_bytes > MAX_BACKLOG_BYTES:
                        self._give_up("BACKLOG_FULL")
                        raise SessionWriteError(self._session_id, "BACKLOG_FULL",
                                                "unwritten entries dropped") from exc
                    # Still pending: sent again ahead of the next append (accepted).
                    raise SessionWriteError(self._session_id, error_kind(exc),
                                            type(exc).__name__, accepted=True) from exc
                if status == "ok":
                    del self._pending[:count]
                elif status == "stale":
                    self._stale = current
                    self._pending.clear()
                    raise StaleWriterError(self._session_id, self._fence, self._stale)
                elif status == "missing":
                    self._give_up("NOT_FOUND")
                    raise SessionWriteError(self._session_id, "NOT_FOUND", "session was deleted")
                else:
                    self._give_up("SEQ_CONFLICT")
                    raise SessionWriteError(
                        self._session_id, "SEQ_CONFLICT",
                        f"writer at seq {merged.first_seq}, stored log continues at {next_seq}",
                    )

    async def _send(self, batch: Batch) -> tuple[str, int, int]:
        """``(status, session's fence, session's next seq)``; see ``append_entries()``."""
        pool = await self._pool()
        row = await pool.fetchrow(
            self._sql_append, self._tenant, self._session_id, self._fence, batch.first_seq,
            batch.types, batch.lines, batch.messages, batch.first_user_text,
        )
        assert row is not None  # the function always returns one row
        return str(row["status"]), int(row["cur_fence"] or 0), int(row["cur_next"] or 0)

    async def _landed(self, count: int) -> int:
        """How many of the first ``count`` pending batches are stored already, exactly."""
        first = self._pending[0].first_seq
        end = self._pending[count - 1].first_seq + len(self._pending[count - 1].lines)
        pool = await self._pool()
        rows = await pool.fetch(self._sql_landed, self._tenant, self._session_id, first, end)
        stored = [bytes(r["line"]) for r in rows]
        landed = position = 0
        for batch in self._pending[:count]:
            if stored[position : position + len(batch.lines)] != batch.lines:
                break
            position += len(batch.lines)
            landed += 1
        return landed

    def _give_up(self, kind: str) -> None:
        self._broken = kind
        self._pending.clear()

    async def flush(self) -> None:
        """Send what earlier failures left pending (a successful append has committed)."""
        if self._pending and self._stale is None and self._broken is None:
            await self._flush()

    async def sync(self) -> None:
        """Nothing to do: every successful append was committed before it returned."""

    async def aclose(self) -> None:
        """Send what earlier failures left pending (once), then refuse further appends."""
        if self._closed:
            return
        try:
            if self._pending and self._stale is None and self._broken is None:
                try:
                    await self._flush()
                except SessionWriteError:
                    log.warning("session %s: %d unwritten bytes lost at close",
                                self._session_id, self.pending_bytes)
        finally:
            self._closed = True
            self._pending.clear()
