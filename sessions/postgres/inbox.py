"""What workers sharing a PostgreSQL store owe: one ``inbox`` row per acknowledged message.

A row is written when a message is received (before the platform is told it was), and marked
``answered_at`` once its reply went out. A row is never taken back: the message it records is
answered, and the platform's redelivery of it is its duplicate. Answered rows stay as long as
a platform may deliver the message again (:meth:`PostgresInbox.prune`), so their platform id
still counts as seen.
The queue of a conversation is its unanswered rows in ``id`` order; ``attempts`` counts the
holders that took the head row (more than one: an earlier holder may have started it, so its
turn is looked up in the log before anything is recorded again). The ``dedup`` column, unique
per tenant, makes "is this a redelivery?" and "record it" one statement. A row lives in the
same database as the sessions, so Redis losing everything loses nothing a platform was told
was received. Migration 4 in :mod:`sessions.postgres.schema` creates the table and the
fencing-token sequence (:meth:`PostgresInbox.next_fence`).

Rows are opaque here: ``conversation`` and ``body`` are whatever the caller encodes (the
coordination layer's wire form of a queued item). Database failures raise
:class:`~sessions.postgres.store.StoreUnavailableError`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sessions.postgres.store import PostgresSessionStore


@dataclass(frozen=True, slots=True)
class Seen:
    """The earlier delivery of a platform id: its item, and the session it was answered in
    (``None`` while it is not answered yet)."""

    item: str
    session_id: str | None
    answered: bool


@dataclass(frozen=True, slots=True)
class Owed:
    """The head of a conversation's queue, as one holder takes it (``fence``: a fresh
    fencing token drawn with it, when asked for)."""

    item: str
    body: str
    attempts: int
    fence: int | None = None


class PostgresInbox:
    """The ``inbox`` table on the session store's own pool (the store owns the pool)."""

    def __init__(self, store: PostgresSessionStore) -> None:
        self._store = store
        q = store.quoted_schema
        self._enter = (f"INSERT INTO {q}.inbox (tenant, conversation, item, dedup, body)"
                       " VALUES ($1, $2, $3, $4, $5)"
                       " ON CONFLICT (tenant, dedup) WHERE dedup IS NOT NULL DO NOTHING"
                       " RETURNING id")
        self._seen = (f"SELECT item, session_id, answered_at IS NOT NULL AS answered"
                      f" FROM {q}.inbox WHERE tenant = $1 AND dedup = $2")
        self._head = (f"UPDATE {q}.inbox SET attempts = attempts + 1 WHERE id = ("
                      f" SELECT id FROM {q}.inbox WHERE tenant = $1 AND conversation = $2"
                      "  AND answered_at IS NULL ORDER BY id LIMIT 1)"
                      " RETURNING item, body, attempts")
        # The token is drawn only when a row comes back (a CTE is read when it is used).
        self._head_fenced = (f"WITH t AS (SELECT nextval('{q}.fences') AS token)"
                             f" {self._head}, (SELECT token FROM t) AS fence")
        self._answered = (f"UPDATE {q}.inbox SET answered_at = now(), session_id = $2"
                          " WHERE item = $1 AND answered_at IS NULL")
        # Both in one statement: the CTE runs to completion whatever the main query reads, and
        # the main query's snapshot still sees the item unanswered, hence ``item <> $1``.
        self._answered_then_head = (
            f"WITH done AS ({self._answered} RETURNING id)"
            f" UPDATE {q}.inbox SET attempts = attempts + 1 WHERE id = ("
            f" SELECT id FROM {q}.inbox WHERE tenant = $3 AND conversation = $4"
            "  AND answered_at IS NULL AND item <> $1 ORDER BY id LIMIT 1)"
            " RETURNING item, body, attempts")
        self._owed = (f"SELECT DISTINCT tenant, conversation FROM {q}.inbox"
                      " WHERE answered_at IS NULL LIMIT $1")
        self._has_owed = (f"SELECT EXISTS (SELECT 1 FROM {q}.inbox WHERE tenant = $1"
                          " AND conversation = $2 AND answered_at IS NULL)")
        self._status = (f"SELECT session_id, answered_at IS NOT NULL AS answered"
                        f" FROM {q}.inbox WHERE item = $1")
        theirs = (" WHERE tenant = $1 AND answered_at IS NOT NULL"
                  " AND (session_id = ANY($2::text[]) OR item = ANY($3::text[]))")
        self._erase = f"DELETE FROM {q}.inbox{theirs}"
        self._count_erased = f"SELECT count(*) FROM {q}.inbox{theirs}"
        self._prune = (f"DELETE FROM {q}.inbox WHERE answered_at IS NOT NULL"
                       " AND answered_at < now() - make_interval(secs => $1)")

    async def enter(self, tenant: str, conversation: str, item: str, dedup: str | None,
                    body: str) -> Seen | None:
        """Record an owed item (committed when this returns); ``None`` when it is new, else
        the earlier delivery of the same ``dedup`` key (nothing recorded)."""
        async with self._store.connection() as conn:
            for _ in range(3):  # the conflicting row may be pruned in between: try again
                if await conn.fetchval(self._enter, tenant, conversation, item, dedup,
                                       body) is not None:
                    return None
                row = await conn.fetchrow(self._seen, tenant, dedup)
                if row is not None:
                    return Seen(str(row["item"]), row["session_id"], bool(row["answered"]))
        raise AssertionError("a conflicting inbox row neither stayed nor went")

    async def head(self, tenant: str, conversation: str, *,
                   fenced: bool = False) -> Owed | None:
        """The oldest unanswered item of a conversation, counted as taken once more; with
        ``fenced``, with a fresh fencing token (:meth:`next_fence`) drawn in the same
        statement, for a holder that has none yet."""
        async with self._store.connection() as conn:
            row = await conn.fetchrow(self._head_fenced if fenced else self._head, tenant,
                                      conversation)
        if row is None:
            return None
        return Owed(str(row["item"]), str(row["body"]), int(row["attempts"]),
                    int(row["fence"]) if fenced else None)

    async def answered(self, item: str, session_id: str | None) -> None:
        """The item's reply went out (idempotent)."""
        async with self._store.connection() as conn:
            await conn.execute(self._answered, item, session_id)

    async def answered_then_head(self, item: str, session_id: str | None, tenant: str,
                                 conversation: str) -> Owed | None:
        """:meth:`answered`, then :meth:`head` of the item's conversation, in one statement
        (one round trip, one commit)."""
        async with self._store.connection() as conn:
            row = await conn.fetchrow(self._answered_then_head, item, session_id, tenant,
                                      conversation)
        if row is None:
            return None
        return Owed(str(row["item"]), str(row["body"]), int(row["attempts"]))

    async def owed_conversations(self, limit: int = 10_000) -> list[tuple[str, str]]:
        """``(tenant, conversation)`` of conversations with unanswered items (the partial
        index: only owed rows are read)."""
        async with self._store.connection() as conn:
            rows = await conn.fetch(self._owed, limit)
        return [(str(r["tenant"]), str(r["conversation"])) for r in rows]

    async def has_owed(self, tenant: str, conversation: str) -> bool:
        async with self._store.connection() as conn:
            return bool(await conn.fetchval(self._has_owed, tenant, conversation))

    async def status(self, item: str) -> tuple[bool, str | None] | None:
        """``(answered, session)`` of an item, ``None`` if there is no such row."""
        async with self._store.connection() as conn:
            row = await conn.fetchrow(self._status, item)
        return None if row is None else (bool(row["answered"]), row["session_id"])

    async def prune(self, older_than: float) -> int:
        """Delete rows answered more than ``older_than`` seconds ago; how many."""
        async with self._store.connection() as conn:
            done = await conn.execute(self._prune, float(older_than))
        return int(done.split()[-1])

    async def erase(self, tenant: str, sessions: Collection[str], items: Collection[str],
                    dry: bool = False) -> int:
        """Delete the answered rows of an erased person (answered in one of ``sessions``, or
        one of their ``items`` in a group): their text and platform ids go; how many rows
        (``dry``: only count them). Unanswered rows stay: those messages are still owed."""
        async with self._store.connection() as conn:
            if dry:
                return int(await conn.fetchval(self._count_erased, tenant, sorted(sessions),
                                               sorted(items)))
            done = await conn.execute(self._erase, tenant, sorted(sessions), sorted(items))
        return int(done.split()[-1])

    async def next_fence(self, at_least: int = 0) -> int:
        """A fresh fencing token (see :meth:`PostgresSessionStore.next_fence`)."""
        return await self._store.next_fence(at_least)
