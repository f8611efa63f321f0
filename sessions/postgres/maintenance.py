"""The PostgreSQL store's bulk work on its tables, each in the caller's connection (and
transaction): an imported log's rows, lines rewritten in place (an erasure's markers in a
group's log), sessions removed by retention. Kept apart from :mod:`sessions.postgres.store`,
which runs them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import asyncpg

from sessions.errors import SessionExistsError
from sessions.postgres.importer import ImportPlan, text_of
from sessions.scan import summarise
from sessions.store import Cutoffs, Pruned

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy



async def rewrite_lines(conn: PoolConnectionProxy[asyncpg.Record], q: str, tenant: str,
                        session_id: str, lines: Mapping[int, bytes]) -> None:
    """Replace the session's lines by ``seq`` (in the caller's transaction; ``q`` is the
    quoted schema), then what the listing shows of it (its first user text, its size),
    computed from the new log. A session that is gone meanwhile is left alone."""
    head = await conn.fetchval(
        f"SELECT id FROM {q}.sessions WHERE tenant = $1 AND id = $2 FOR UPDATE",
        tenant, session_id,
    )
    if head is None:
        return
    await conn.executemany(
        f"UPDATE {q}.entries SET line = $4 WHERE tenant = $1 AND session_id = $2 AND seq = $3",
        [(tenant, session_id, seq, data) for seq, data in sorted(lines.items())],
    )
    rows = await conn.fetch(
        f"SELECT line FROM {q}.entries WHERE tenant = $1 AND session_id = $2 ORDER BY seq",
        tenant, session_id,
    )
    log_bytes = b"".join(bytes(r["line"]) + b"\n" for r in rows)
    summary = summarise(log_bytes)
    await conn.execute(
        f"UPDATE {q}.sessions SET first_user_text = $3, size_bytes = $4"
        " WHERE tenant = $1 AND id = $2",
        tenant, session_id, summary.first_user_text, len(log_bytes),
    )


async def insert_imported(conn: PoolConnectionProxy[asyncpg.Record], q: str, schema: str,
                          tenant: str, sid: str, version: int | None, plan: ImportPlan) -> None:
    """An imported log's session row and entry rows (fence 0: any ``open()`` takes it
    over). :class:`~sessions.errors.SessionExistsError` when the id is taken."""
    head = plan.header
    try:
        await conn.execute(
            f"INSERT INTO {q}.sessions (tenant, id, started_at, channel,"
            " conversation, version, header, fence, next_seq, message_count,"
            " first_user_text, size_bytes)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, 0, $8, $9, $10, $11)",
            tenant, sid, text_of(head.get("startedAt")), text_of(head.get("channel")),
            text_of(head.get("conversation")), version, plan.rows[0][2].decode(),
            len(plan.rows), plan.summary.message_count, plan.summary.first_user_text,
            plan.size,
        )
    except asyncpg.UniqueViolationError as exc:
        raise SessionExistsError(f"session {sid} already exists") from exc
    await conn.copy_records_to_table(
        "entries", schema_name=schema,
        columns=("tenant", "session_id", "seq", "type", "line"),
        records=[(tenant, sid, seq, kind, line) for seq, kind, line in plan.rows],
    )


async def prune_rows(conn: PoolConnectionProxy[asyncpg.Record], q: str, cutoffs: Cutoffs, *,
                     dry: bool) -> list[Pruned]:
    """Delete (``dry``: select) the sessions last modified before their tenant's cutoff
    (their entries go with them): one statement for the default cutoff, the tenants of
    their own left out, and one per tenant of its own, each reading only the sessions older
    than it (the ``sessions_by_modified`` index)."""
    columns = "tenant, id, size_bytes, extract(epoch FROM modified_at)::float8 AS mtime"
    head, tail = (f"SELECT {columns}", "") if dry else ("DELETE", f" RETURNING {columns}")
    asked: list[tuple[str, float | None, object]] = [
        (" AND NOT tenant = ANY($2::text[])", cutoffs.default, list(cutoffs.tenants))]
    asked += [(" AND tenant = $2", cutoff, name) for name, cutoff in cutoffs.tenants.items()]
    found: list[Pruned] = []
    for where, cutoff, arg in asked:
        if cutoff is None:
            continue
        rows = await conn.fetch(f"{head} FROM {q}.sessions WHERE modified_at < to_timestamp($1)"
                                f"{where}{tail}", cutoff, arg)
        found += [Pruned(str(r["tenant"]), str(r["id"]), int(r["size_bytes"]), float(r["mtime"]))
                  for r in rows]
    return found
