"""The composition root's erasure wiring: which steps an erasure runs, how it reaches the
running gateway's conversations and the other workers (``gateway run``), and the erasure
``gateway forget`` runs itself when no gateway serves the data directory.

Kept beside :mod:`app.compose` (which calls :func:`gateway_erasure`) so the erasure's wiring
changes in one place: a new kind of personal data adds its step in :func:`build_eraser`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from app.compose_tools import MCP_LOGS_DIR
from app.config import Settings
from app.erasure_endpoint import ErasureEndpoint
from coordination.journal import JOURNAL_FILE, FileJournal
from gateway.edge.coordination import ConversationQueue, Coordinator
from gateway.edge.erasure import ErasureBus, Holder
from gateway.edge.errors import ConfigError
from gateway.edge.scopes import Scope
from gateway.erasure.eraser import Eraser, ErasurePlan, ErasureStep
from gateway.erasure.service import ErasureService
from gateway.erasure.steps import BlobStep, McpLogStep, MemoryStep, OwedStep, RerunStep
from gateway.persona.memory_scopes import delete_scope, scope_dir
from gateway.persona.workspace import PersonaWorkspace
from gateway.schedule.erasure import ScheduleStep
from gateway.schedule.store import ScheduleStore
from sessions.blobs import BlobStore
from sessions.store import SessionStore


def build_eraser(persona_root: Path, store: SessionStore,
                 workspace: PersonaWorkspace | None = None,
                 blobs: BlobStore | None = None,
                 reruns: SessionStore | None = None,
                 owed: OwedStep | None = None, data_dir: Path | None = None,
                 schedules: ScheduleStore | None = None) -> Eraser:
    """What ``gateway forget`` and ``/forget`` run: the sessions (deleted, or a group's
    rewritten with markers) and a tombstone, then the memory scope (through the running
    gateway's workspace, so its cache forgets too; else straight from the disk), the blobs
    only they referred to, the rerun logs of those sessions, the delivery records and (with
    ``data_dir``) the stderr logs of the MCP servers their sessions called."""

    async def files(plan: ErasurePlan) -> list[str]:
        return await asyncio.to_thread(_scope_files, persona_root, plan.scope)

    async def forget(plan: ErasurePlan) -> list[str]:
        if workspace is not None:
            return await workspace.forget(plan.scope)
        return await asyncio.to_thread(delete_scope, persona_root, plan.scope)

    steps: list[ErasureStep] = [MemoryStep(files, forget)]
    if blobs is not None:
        steps.append(BlobStep(blobs, store, reruns))
    if reruns is not None:
        steps.append(RerunStep(reruns))
    if owed is not None:
        steps.append(owed)
    if data_dir is not None:
        steps.append(mcp_log_step(data_dir, store))
    if schedules is not None:  # their reminders, schedules to their DM, their time zone
        steps.append(ScheduleStep(schedules))
    return Eraser(store, steps)


def _scope_files(root: Path, scope: Scope) -> list[str]:
    directory = scope_dir(root, scope)
    if not directory.is_dir() or directory.is_symlink():
        return []
    rel = directory.relative_to(root).as_posix()
    return sorted(f"{rel}/{p.relative_to(directory).as_posix()}" for p in directory.rglob("*")
                  if p.is_file() or p.is_symlink())


def owed_step(conversations: ConversationQueue) -> OwedStep:
    """The delivery records: the owed journal (one process) or the inbox rows (workers)."""

    async def records(tenant: str, sessions: Collection[str], items: Collection[str],
                      dry: bool) -> int:
        return await conversations.erase(tenant, sessions, items, dry)

    return OwedStep("journal" if conversations.records_on_receipt else "inbox", records)


def gateway_erasure(settings: Settings, store: SessionStore,
                    workspace: PersonaWorkspace | None, blobs: BlobStore,
                    reruns: SessionStore, coordinator: Coordinator, holder: Holder,
                    schedules: ScheduleStore | None = None,
                    ) -> tuple[ErasureService, ErasureEndpoint]:
    """The running gateway's erasure service and its endpoint (control socket, other
    workers' holds), both holding conversations still through ``holder`` (the pauses the
    router brackets its work with)."""
    eraser = build_eraser(settings.persona_root, store, workspace, blobs, reruns,
                          owed_step(coordinator.conversations), settings.data_dir, schedules)
    bus = coordinator.erasure_bus()
    mcp = mcp_log_step(settings.data_dir, store)
    service = ErasureService(eraser, holder, bus=bus, mcp_servers=mcp.servers)
    return service, ErasureEndpoint(service, settings.data_dir, bus, holder=holder,
                                    own=mcp.empty)


def mcp_log_step(data_dir: Path, store: SessionStore) -> McpLogStep:
    """The stderr logs of this process's MCP servers (``<data>/mcp-logs``)."""
    return McpLogStep(data_dir / MCP_LOGS_DIR, store)


@dataclass(frozen=True, slots=True)
class CliBus:
    """The bus ``gateway forget`` reaches the workers through, and its Redis client."""

    bus: ErasureBus
    aclose: Callable[[], Awaitable[None]]


def cli_bus(settings: Settings) -> CliBus | None:
    """The workers' bus (``GATEWAY_REDIS_URL``); ``None`` without workers."""
    if settings.redis_url is None:
        return None
    import redis.asyncio as aioredis

    from coordination.keys import Keys
    from coordination.redis_erasure import RedisErasureBus

    client = aioredis.Redis.from_url(settings.redis_url.get_secret_value(),
                                     decode_responses=True, socket_connect_timeout=5.0)
    return CliBus(RedisErasureBus(client, Keys(settings.redis_prefix), f"cli{os.getpid()}"),
                  client.aclose)


def inbox_step(store: SessionStore) -> OwedStep:
    """The workers' inbox rows (in the PostgreSQL ``store``), for ``gateway forget``."""
    from sessions.postgres.inbox import PostgresInbox
    from sessions.postgres.store import PostgresSessionStore

    if not isinstance(store, PostgresSessionStore):
        raise ConfigError("several workers (GATEWAY_REDIS_URL) share a PostgreSQL store: "
                          "set GATEWAY_STORE_URL too")
    inbox = PostgresInbox(store)
    return OwedStep("inbox", lambda tenant, sessions, items, dry: inbox.erase(
        tenant, sessions, items, dry))


@asynccontextmanager
async def direct_journal(data_dir: Path) -> AsyncIterator[FileJournal]:
    """The owed journal of a data directory no gateway serves, held (locked) while the
    erasure runs, so no gateway starts on it meanwhile; ``ConfigError`` when one runs."""
    journal = FileJournal(data_dir / "state" / JOURNAL_FILE)
    await journal.open()
    try:
        yield journal
    finally:
        await journal.settle()
        journal.close()
