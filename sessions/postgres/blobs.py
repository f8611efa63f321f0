"""The PostgreSQL blob store: attachment bytes in the ``blobs`` table, beside the sessions.

One row per ``(tenant, hash)`` (migration 2 in :mod:`sessions.postgres.schema`), on the session
store's own connection pool, so a log and the blobs it refers to live in one database and
every worker sees both. An insert of bytes already stored does nothing (``ON CONFLICT DO
NOTHING``, unless the row's bytes are not these: then the damaged row is repaired); it returns
once committed, as durable as the session appends. Reads check the bytes against their hash
(:func:`sessions.blobs.checked`, as every backend does, in a worker thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from sessions.blobs import BlobInfo, checked, digest_of, validate_digest
from sessions.errors import BlobMissingError, BlobWriteError, SessionError
from sessions.names import validate_tenant
from sessions.postgres.store import PostgresSessionStore, StoreUnavailableError
from sessions.postgres.writer import DB_ERRORS, error_kind


class PostgresBlobStore:
    """Blobs in PostgreSQL. See :class:`sessions.blobs.BlobStore`. Closing it leaves the
    session store (and its pool) open: the store owns the pool."""

    def __init__(self, store: PostgresSessionStore) -> None:
        self._store = store
        self._q = store.quoted_schema

    @property
    def store(self) -> PostgresSessionStore:
        """The session store whose pool and schema hold the blobs."""
        return self._store

    async def put(self, tenant: str, data: bytes) -> str:
        validate_tenant(tenant)
        digest = await asyncio.to_thread(digest_of, data)
        try:
            pool = await self._store.pool()
            async with pool.acquire() as conn:
                await conn.execute(
                    # A row under this hash whose bytes are not these is damaged: the right
                    # bytes repair it (as a put over a damaged file does); an intact one is
                    # left alone.
                    f"INSERT INTO {self._q}.blobs AS b (tenant, hash, size, data)"
                    " VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, hash) DO UPDATE"
                    " SET size = EXCLUDED.size, data = EXCLUDED.data"
                    " WHERE b.data IS DISTINCT FROM EXCLUDED.data",
                    tenant, digest, len(data), data,
                )
        except SessionError as exc:
            raise BlobWriteError(error_kind(exc)) from exc
        except DB_ERRORS as exc:
            raise BlobWriteError(error_kind(exc), type(exc).__name__) from exc
        return digest

    async def get(self, tenant: str, digest: str) -> bytes:
        found = await self.get_many(tenant, [digest])
        if digest not in found:
            raise BlobMissingError(digest, "no such blob")
        return found[digest]

    async def get_many(self, tenant: str, digests: Iterable[str]) -> dict[str, bytes]:
        validate_tenant(tenant)
        wanted = [validate_digest(d) for d in digests]
        if not wanted:
            return {}
        rows = await self._fetch(
            f"SELECT hash, data FROM {self._q}.blobs WHERE tenant = $1 AND hash = ANY($2)",
            tenant, wanted,
        )
        pairs = [(str(r["hash"]), bytes(r["data"])) for r in rows]
        return await asyncio.to_thread(_checked, pairs)

    async def list_blobs(self, tenant: str) -> list[BlobInfo]:
        validate_tenant(tenant)
        rows = await self._fetch(
            "SELECT hash, size, extract(epoch FROM stored_at)::float8 AS at"
            f" FROM {self._q}.blobs WHERE tenant = $1", tenant,
        )
        return [BlobInfo(str(r["hash"]), int(r["size"]), float(r["at"])) for r in rows]

    async def delete(self, tenant: str, digests: Iterable[str]) -> int:
        validate_tenant(tenant)
        wanted = [validate_digest(d) for d in digests]
        if not wanted:
            return 0
        rows = await self._fetch(
            f"DELETE FROM {self._q}.blobs WHERE tenant = $1 AND hash = ANY($2) RETURNING hash",
            tenant, wanted,
        )
        return len(rows)

    async def tenants(self) -> list[str]:
        rows = await self._fetch(f"SELECT DISTINCT tenant FROM {self._q}.blobs ORDER BY tenant")
        return [str(r["tenant"]) for r in rows]

    async def aclose(self) -> None:
        return None

    async def _fetch(self, sql: str, *args: object) -> list[dict[str, Any]]:
        try:
            pool = await self._store.pool()
            async with pool.acquire() as conn:
                return [dict(r) for r in await conn.fetch(sql, *args)]
        except SessionError:
            raise
        except DB_ERRORS as exc:
            raise StoreUnavailableError(error_kind(exc), type(exc).__name__) from exc


def _checked(pairs: list[tuple[str, bytes]]) -> dict[str, bytes]:
    """The rows, each passed through :func:`checked` (a damaged one is refused, named)."""
    return {digest: checked(digest, data) for digest, data in pairs}
