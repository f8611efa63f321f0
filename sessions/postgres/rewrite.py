"""Rewriting lines of a PostgreSQL session in place (an erasure's markers in a group's log).

Kept apart from :mod:`sessions.postgres.store`, which runs it inside its erasure's
transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sessions.scan import summarise

if TYPE_CHECKING:
    import asyncpg
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
