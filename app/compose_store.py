"""The composition root, store half: where the log and what lives beside it are kept.

One factory picks the session store (PostgreSQL when ``GATEWAY_STORE_URL`` is set, else JSONL
files), and the parts that follow that choice live with it: the disk reserve, the rerun logs,
the blob store, the schema check at start, and how many sessions the store lets stay open.
Kept apart from :mod:`app.compose` because the operator commands (``replay``, ``prune``,
``forget``...) open a store without building a gateway.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from app.config import Settings
from app.hints import as_typed
from gateway.edge.errors import ConfigError
from sessions.blob_files import FileBlobStore
from sessions.blobs import BlobStore
from sessions.jsonl import JsonlSessionStore
from sessions.postgres import schema as pg_schema
from sessions.reserve import RESERVE_FILE, DiskReserve
from sessions.store import Durability, SessionStore
from sessions.sync_lane import SyncLane


def build_store(settings: Settings, reserve: DiskReserve | None = None,
                syncer: SyncLane | None = None) -> SessionStore:
    """The one store factory: PostgreSQL when ``GATEWAY_STORE_URL`` is set, else JSONL files
    under the data dir (with the durability setting). Every command uses it; ``gateway run``
    passes the data directory's disk reserve (:func:`build_reserve`) and its sync lane (shared
    with the owed journal)."""
    return open_store(settings.data_dir, settings.store_url.get_secret_value()
                      if settings.store_url is not None else None,
                      schema=settings.store_schema, durability=settings.durability,
                      stall_after=settings.persist_timeout, reserve=reserve, syncer=syncer,
                      pool_size=settings.store_pool_size,
                      pgbouncer=settings.store_pgbouncer)


def build_reserve(settings: Settings) -> DiskReserve | None:
    """Room kept on the data directory's disk for what a stop while it is full would drop
    (JSONL store only: PostgreSQL keeps its own disk); ``None`` when it is off."""
    if settings.store_url is not None or settings.disk_reserve <= 0:
        return None
    return DiskReserve(settings.data_dir / "state" / RESERVE_FILE, settings.disk_reserve)


RERUNS_DIR = "reruns"
"""Where ``gateway replay --rerun --save`` keeps its logs: ``<data>/reruns/<tenant>/``."""


def rerun_store(data_dir: Path) -> SessionStore:
    """The store of rerun logs (JSONL, beside the sessions, never mixed with them)."""
    return JsonlSessionStore(data_dir, durability="turn", folder=RERUNS_DIR)


def open_store(data_dir: Path, store_url: str | None = None, *,
               schema: str = pg_schema.DEFAULT_SCHEMA,
               durability: Durability = "turn", stall_after: float = 2.0,
               reserve: DiskReserve | None = None,
               syncer: SyncLane | None = None, pool_size: int | None = None,
               pgbouncer: bool = False) -> SessionStore:
    """A store from its parts (operator commands whose flags override the settings).
    ``stall_after``: when a JSONL write the disk has not finished counts as failed (the
    persist timeout). ``syncer``: the JSONL files' fsyncs (:mod:`sessions.sync_lane`).
    ``pool_size``, ``pgbouncer``: the PostgreSQL store's pool (``GATEWAY_STORE_POOL_SIZE``,
    ``GATEWAY_STORE_PGBOUNCER``)."""
    if store_url is not None:
        from sessions.postgres.pool import POOL_SIZE
        from sessions.postgres.store import PostgresSessionStore

        return PostgresSessionStore(store_url, schema=schema, max_size=pool_size or POOL_SIZE,
                                    statement_cache=not pgbouncer)
    return JsonlSessionStore(data_dir, durability=durability, stall_after=stall_after,
                             reserve=reserve, syncer=syncer)


def blob_store_for(store: SessionStore, data_dir: Path,
                   durability: Durability = "turn") -> BlobStore:
    """The blob store that lives with ``store``: the PostgreSQL table beside its sessions, or
    files beside the JSONL logs (as durable as they are)."""
    # A PostgreSQL store's module is loaded exactly when such a store exists.
    pg = sys.modules.get("sessions.postgres.store")
    if pg is not None and isinstance(store, pg.PostgresSessionStore):
        from sessions.postgres.blobs import PostgresBlobStore

        return PostgresBlobStore(store)
    if isinstance(store, JsonlSessionStore):
        return FileBlobStore(store.data_dir, durable=store.durability != "none")
    return FileBlobStore(data_dir, durable=durability != "none")


@asynccontextmanager
async def schema_checked(store: SessionStore) -> AsyncIterator[None]:
    """A PostgreSQL store's schema, checked as the gateway starts: one at another version
    (never upgraded, say) stops the start with one line naming the command that fixes it,
    where it used to start healthy and fail every message. A database out of reach does not
    stop it: messages get 503 until the database is back, as in any outage."""
    pg = sys.modules.get("sessions.postgres.store")
    if pg is not None and isinstance(store, pg.PostgresSessionStore):
        try:
            await store.connect_pool()
        except pg_schema.SchemaVersionError as exc:
            raise ConfigError(as_typed(str(exc))) from exc
        except pg.StoreUnavailableError:
            pass  # an outage at start is an outage: the store answers 503 until it ends
    yield


def open_sessions_bound(settings: Settings, store: SessionStore) -> int | None:
    """How many sessions may stay open by count: ``GATEWAY_MAX_OPEN_SESSIONS``, else for a
    JSONL store (a descriptor each) a quarter of the descriptors the process may open, at
    most 4,096; a PostgreSQL store holds none (memory alone bounds it)."""
    if settings.max_open_sessions is not None:
        return settings.max_open_sessions
    if not isinstance(store, JsonlSessionStore):
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(64, min(soft // 4, 4096))
