"""Schedules in PostgreSQL, beside the sessions, shared by every worker (migration 5).

A row per schedule: the record as JSON in ``body`` (:func:`sessions.schedules.to_json`) and
the columns the queries need. The two firing steps of
:class:`gateway.schedule.store.ScheduleStore` each run in one transaction that takes its rows
with ``FOR UPDATE SKIP LOCKED``: a row one worker is claiming or delivering is skipped by the
others, never waited for. Delivering holds the rows' locks while the router records each
occurrence owed (on another pooled connection, committed at once), then writes the outcomes
and commits; a worker killed meanwhile has its transaction rolled back and its locks
released as its connection drops, and the next worker delivers those occurrences again (the
owed queue's dedup step refuses the ones already owed). New schedules are counted against
the limits under a transaction-scoped advisory lock per tenant, so two workers adding at once
cannot both take the last place. Database failures raise
:class:`~sessions.postgres.store.StoreUnavailableError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from sessions.postgres.store import PostgresSessionStore
from sessions.schedules import ScheduleLimitError, ScheduleRecord, from_json, to_json

Plan = Callable[[ScheduleRecord, float], ScheduleRecord]
Deliver = Callable[[ScheduleRecord], Awaitable[ScheduleRecord]]


def _row(record: ScheduleRecord) -> tuple[Any, ...]:
    target = record.target
    person = (target.person or target.chat) if target.chat_type == "private" else None
    return (record.tenant, record.id, record.owner, record.state, record.next_at,
            record.firing, record.held_until, target.channel, person, record.created_at,
            orjson.dumps(to_json(record)).decode())


class PostgresScheduleStore:
    """See the module docstring; on the session store's pool (the store owns it)."""

    def __init__(self, store: PostgresSessionStore) -> None:
        self._store = store
        q = store.quoted_schema
        columns = ("tenant, id, owner, state, next_at, firing, held_until, target_channel,"
                   " target_person, created_at, body")
        self._insert = f"INSERT INTO {q}.schedules ({columns}) VALUES ($1, $2, $3, $4, $5," \
                       " $6, $7, $8, $9, $10, $11)"
        self._upsert = (self._insert + " ON CONFLICT (tenant, id) DO UPDATE SET owner = $3,"
                        " state = $4, next_at = $5, firing = $6, held_until = $7,"
                        " target_channel = $8, target_person = $9, created_at = $10, body = $11")
        self._update = (f"UPDATE {q}.schedules SET owner = $3, state = $4, next_at = $5,"
                        " firing = $6, held_until = $7, target_channel = $8,"
                        " target_person = $9, created_at = $10, body = $11"
                        " WHERE tenant = $1 AND id = $2")
        self._lock = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
        self._count = (f"SELECT count(*) FILTER (WHERE owner = $2) AS mine, count(*) AS all"
                       f" FROM {q}.schedules WHERE tenant = $1 AND state = 'active'")
        self._get = f"SELECT body FROM {q}.schedules WHERE tenant = $1 AND id = $2"
        self._find = (f"SELECT body FROM {q}.schedules WHERE ($1::text IS NULL OR tenant = $1)"
                      " AND ($2::text IS NULL OR owner = $2)"
                      " AND (NOT $3 OR state = 'active') ORDER BY created_at, id")
        self._cancel_row = (f"SELECT body FROM {q}.schedules WHERE tenant = $1 AND id = $2"
                            " AND state = 'active' AND ($3::text IS NULL OR owner = $3)"
                            " FOR UPDATE")
        # As sessions.schedules.belongs_to: who set it is in the body only (erasure is rare).
        self._erase = (f"DELETE FROM {q}.schedules WHERE tenant = $1 AND (owner = $2"
                       " OR body::jsonb ->> 'created_by' = $2"
                       " OR (target_channel = $3 AND target_person = $4)) RETURNING id")
        self._erase_zone = f"DELETE FROM {q}.schedule_zones WHERE tenant = $1 AND person = $2"
        self._zone = f"SELECT zone FROM {q}.schedule_zones WHERE tenant = $1 AND person = $2"
        self._set_zone = (f"INSERT INTO {q}.schedule_zones (tenant, person, zone)"
                          " VALUES ($1, $2, $3)"
                          " ON CONFLICT (tenant, person) DO UPDATE SET zone = $3")
        self._due = (f"SELECT body FROM {q}.schedules WHERE state = 'active'"
                     " AND firing IS NULL AND next_at <= $1 ORDER BY next_at LIMIT $2"
                     " FOR UPDATE SKIP LOCKED")
        self._claimed = (f"SELECT body FROM {q}.schedules WHERE firing IS NOT NULL"
                         " AND (held_until IS NULL OR held_until <= $1)"
                         " ORDER BY firing LIMIT $2 FOR UPDATE SKIP LOCKED")
        self._next = (f"SELECT least((SELECT min(next_at) FROM {q}.schedules"
                      "  WHERE state = 'active' AND firing IS NULL),"
                      f" (SELECT min(coalesce(held_until, firing)) FROM {q}.schedules"
                      "  WHERE firing IS NOT NULL))")

    def __repr__(self) -> str:
        return f"PostgresScheduleStore({self._store!r})"

    async def add(self, record: ScheduleRecord, *, per_owner: int, per_tenant: int) -> None:
        async with self._store.connection() as conn, conn.transaction():
            await conn.execute(self._lock, f"schedules:{record.tenant}")
            counts = await conn.fetchrow(self._count, record.tenant, record.owner)
            assert counts is not None
            if per_owner and int(counts["mine"]) >= per_owner:
                raise ScheduleLimitError(f"at most {per_owner} active schedules each")
            if per_tenant and int(counts["all"]) >= per_tenant:
                raise ScheduleLimitError(f"at most {per_tenant} active schedules here")
            await conn.execute(self._insert, *_row(record))

    async def put(self, record: ScheduleRecord) -> None:
        async with self._store.connection() as conn:
            await conn.execute(self._upsert, *_row(record))

    async def get(self, tenant: str, schedule_id: str) -> ScheduleRecord | None:
        async with self._store.connection() as conn:
            body = await conn.fetchval(self._get, tenant, schedule_id)
        return None if body is None else from_json(orjson.loads(body))

    async def find(self, tenant: str | None = None, *, owner: str | None = None,
                   active_only: bool = True) -> list[ScheduleRecord]:
        async with self._store.connection() as conn:
            rows = await conn.fetch(self._find, tenant, owner, active_only)
        return [from_json(orjson.loads(r["body"])) for r in rows]

    async def cancel(self, tenant: str, schedule_id: str, *,
                     owner: str | None = None) -> ScheduleRecord | None:
        # Waits for a worker delivering it (the row lock), so its outcome is not overwritten.
        async with self._store.connection() as conn, conn.transaction():
            body = await conn.fetchval(self._cancel_row, tenant, schedule_id, owner)
            if body is None:
                return None
            found = from_json(orjson.loads(body))
            cancelled = dataclasses.replace(found, state="cancelled", next_at=None)
            await conn.execute(self._update, *_row(cancelled))
        return cancelled

    async def erase_person(self, tenant: str, channel: str, person: str) -> list[str]:
        async with self._store.connection() as conn, conn.transaction():
            rows = await conn.fetch(self._erase, tenant, f"person:{channel}:{person}",
                                    channel, person)
            await conn.execute(self._erase_zone, tenant, f"{channel}:{person}")
        return sorted(str(r["id"]) for r in rows)

    async def zone(self, tenant: str, person: str) -> str | None:
        async with self._store.connection() as conn:
            found = await conn.fetchval(self._zone, tenant, person)
        return None if found is None else str(found)

    async def set_zone(self, tenant: str, person: str, zone: str | None) -> None:
        async with self._store.connection() as conn:
            if zone is None:
                await conn.execute(self._erase_zone, tenant, person)
            else:
                await conn.execute(self._set_zone, tenant, person, zone)

    async def claim(self, now: float, plan: Plan, limit: int) -> int:
        async with self._store.connection() as conn, conn.transaction():
            rows = await conn.fetch(self._due, now, limit)
            claimed = [plan(from_json(orjson.loads(r["body"])), now) for r in rows]
            await self._write(conn, claimed)
        return len(claimed)

    async def deliver(self, now: float, deliver: Deliver, limit: int) -> int:
        async with self._store.connection() as conn, conn.transaction():
            rows = await conn.fetch(self._claimed, now, limit)
            done = [await deliver(from_json(orjson.loads(r["body"]))) for r in rows]
            await self._write(conn, [record.settled() for record in done])
        return len(done)

    async def _write(self, conn: Any, records: Sequence[ScheduleRecord]) -> None:
        if records:
            await conn.executemany(self._update, [_row(r) for r in records])

    async def next_due(self) -> float | None:
        async with self._store.connection() as conn:
            found = await conn.fetchval(self._next)
        return None if found is None else float(found)

    async def aclose(self) -> None:
        return None  # the session store owns the pool
