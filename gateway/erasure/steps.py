"""The erasure steps: each kind of a person's data beyond the session logs
(:class:`gateway.erasure.eraser.ErasureStep`). The composition root picks which run."""

from __future__ import annotations

import asyncio
import glob
import os
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

import orjson

from gateway.erasure.eraser import ErasurePlan, Removal
from sessions.attachments import referenced
from sessions.blobs import BlobStore
from sessions.errors import SessionNotFoundError
from sessions.store import SessionStore
from sessions.tombstones import tombstone

MemoryFiles = Callable[[ErasurePlan], Awaitable[list[str]]]


class MemoryStep:
    """The person's memory scope (``memory/<tenant>/<channel>/people/<id>/``): ``files`` lists
    it, ``forget`` deletes it (the running gateway's workspace, so its cache forgets too)."""

    def __init__(self, files: MemoryFiles, forget: MemoryFiles) -> None:
        self._files = files
        self._forget = forget

    async def find(self, plan: ErasurePlan) -> list[Removal]:
        return [Removal("memory", path) for path in await self._files(plan)]

    async def remove(self, plan: ErasurePlan, found: list[Removal],
                     requested_by: str) -> list[Removal]:
        return [Removal("memory", path) for path in await self._forget(plan)]


class BlobStep:
    """The attachments only the person's messages referred to (photos, voice notes, files;
    and files the agent sent them), as the logs will be after the erasure: a file someone
    else's message (or a rerun log) still refers to stays with it."""

    def __init__(self, blobs: BlobStore, store: SessionStore,
                 reruns: SessionStore | None = None) -> None:
        self.blobs = blobs
        self.store = store
        self.reruns = reruns

    async def find(self, plan: ErasurePlan) -> list[Removal]:
        tenant = plan.scope.tenant
        theirs: set[str] = set()
        for sid in plan.sessions:
            theirs.update(await _referenced(self.store, tenant, sid))
        for sid in plan.rewrites:  # as they are now (the plan holds them as they will be)
            theirs.update(await _referenced(self.store, tenant, sid))
        if not theirs:
            return []
        kept: set[str] = set()
        for sid, data in plan.logs.items():
            if sid not in plan.sessions:
                kept.update(referenced(data))
        if self.reruns is not None:
            for info in await self.reruns.list_sessions(tenant):
                if info.conversation not in plan.touched:
                    kept.update(await _referenced(self.reruns, tenant, info.session_id))
        return [Removal("blob", digest) for digest in sorted(theirs - kept)]

    async def remove(self, plan: ErasurePlan, found: list[Removal],
                     requested_by: str) -> list[Removal]:
        await self.blobs.delete(plan.scope.tenant, [r.name for r in found])
        return found


class RerunStep:
    """The rerun logs made from the sessions the erasure deletes or rewrites (``gateway
    replay --rerun --save`` keeps them beside the sessions, in a store of their own, and each
    holds a copy of the messages of the call it reran)."""

    def __init__(self, reruns: SessionStore) -> None:
        self.reruns = reruns

    async def find(self, plan: ErasurePlan) -> list[Removal]:
        if not plan.touched:
            return []
        return [Removal("rerun", info.session_id)
                for info in await self.reruns.list_sessions(plan.scope.tenant)
                if info.conversation in plan.touched]  # a rerun log's conversation: its session

    async def remove(self, plan: ErasurePlan, found: list[Removal],
                     requested_by: str) -> list[Removal]:
        if not found:
            return []
        scope = plan.scope
        doomed = [r.name for r in found]
        deleted = await self.reruns.erase(scope.tenant, doomed, tombstone(
            tenant=scope.tenant, kind=scope.kind, channel=scope.channel, ident=scope.id,
            requested_by=requested_by, sessions=doomed, removed={"rerun": len(doomed)},
        ))
        return [Removal("rerun", sid) for sid in deleted]


OwedRecords = Callable[[str, Collection[str], Collection[str], bool], Awaitable[int]]
"""``(tenant, sessions, items, dry)`` -> how many records of theirs (``dry``: only count)."""


class OwedStep:
    """What the delivery records keep of their answered messages: the owed journal's lines
    (``state/delivery.jsonl``, rewritten without them) or the inbox rows (PostgreSQL).
    ``kind`` names them in the report (``journal`` lines, ``inbox`` rows)."""

    def __init__(self, kind: str, records: OwedRecords) -> None:
        self.kind = kind
        self.records = records

    async def find(self, plan: ErasurePlan) -> list[Removal]:
        count = await self.records(plan.scope.tenant, plan.touched, plan.items, True)
        return [Removal(self.kind, f"{count} record(s)")] * bool(count)

    async def remove(self, plan: ErasurePlan, found: list[Removal],
                     requested_by: str) -> list[Removal]:
        count = await self.records(plan.scope.tenant, plan.touched, plan.items, False)
        return [Removal(self.kind, f"{count} record(s)")] * bool(count)


class McpLogStep:
    """The stderr logs of the MCP servers the person's one-to-one sessions called tools of
    (``<data>/mcp-logs/<server>.log`` and its rotated siblings): a server may have logged what
    those calls carried, and a log has no owner per line, so it is emptied whole (a running
    server goes on appending to it)."""

    def __init__(self, log_dir: Path, store: SessionStore) -> None:
        self.log_dir = log_dir
        self.store = store

    async def servers(self, plan: ErasurePlan) -> set[str]:
        """The MCP servers the person's one-to-one sessions called (read before they go):
        what the other workers, whose logs may lie in data folders of their own, empty too
        (:class:`~gateway.edge.erasure.Changed`)."""
        servers: set[str] = set()
        for sid in plan.sessions:
            try:
                servers.update(_servers(await self.store.read_log(plan.scope.tenant, sid)))
            except SessionNotFoundError:
                continue
        return servers

    async def find(self, plan: ErasurePlan) -> list[Removal]:
        found = await asyncio.to_thread(self._files, await self.servers(plan))
        return [Removal("mcp-log", path.name) for path in found]

    async def empty(self, servers: Collection[str]) -> list[str]:
        """Empty this process's logs of ``servers`` (an erasure another worker ran: the
        :data:`~gateway.edge.erasure.OwnErasure` of this worker); the names emptied."""
        found = await asyncio.to_thread(self._files, set(servers))
        removals = [Removal("mcp-log", path.name) for path in found]
        return [r.name for r in await self.remove_found(removals)]

    def _files(self, servers: set[str]) -> list[Path]:
        found: list[Path] = []
        for server in sorted(servers):
            name = f"{server.replace('/', '_')}.log"
            for path in sorted(self.log_dir.glob(f"{glob.escape(name)}*")):
                if path.is_file() and not path.is_symlink() and path.stat().st_size:
                    found.append(path)
        return found

    async def remove(self, plan: ErasurePlan, found: list[Removal],
                     requested_by: str) -> list[Removal]:
        return await self.remove_found(found)

    async def remove_found(self, found: list[Removal]) -> list[Removal]:
        def empty() -> list[Removal]:
            done = []
            for removal in found:
                path = self.log_dir / removal.name
                try:
                    os.truncate(path, 0)
                except FileNotFoundError:
                    continue
                done.append(removal)
            return done

        return await asyncio.to_thread(empty)


def _servers(data: bytes) -> set[str]:
    """The servers named in a log's tool-call records (``meta.toolCalls``)."""
    found: set[str] = set()
    for raw in data.split(b"\n"):
        if b'"toolCalls"' not in raw:
            continue
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        meta = entry.get("meta") if isinstance(entry, dict) else None
        calls = meta.get("toolCalls") if isinstance(meta, dict) else None
        for call in calls if isinstance(calls, list) else ():
            server = call.get("server") if isinstance(call, dict) else None
            if isinstance(server, str) and server:
                found.add(server)
    return found


async def _referenced(store: SessionStore, tenant: str, session_id: str) -> set[str]:
    try:
        return referenced(await store.read_log(tenant, session_id))
    except SessionNotFoundError:
        return set()

