"""Erasure on request: a person's memory scope and one-to-one session logs, then a tombstone.

:class:`Eraser` is what ``gateway forget`` and the ``/forget`` chat command call. It runs its
**steps** in order (each removes one kind of data the person owns and says what it removed:
the memory scope's files, the attachments of their sessions, ...), then deletes their
one-to-one sessions and records one tombstone in the session store, in one store call
(:meth:`sessions.store.SessionStore.erase`). To erase a new kind of data, add a step where
the composition root builds the eraser; nothing else changes.

Whose sessions are they? A session whose header names the person's scope (every session
since scopes: the registry records it). Sessions written before name none; one of those is
the person's when its conversation is named after them (``CHANNEL:ID``: a Telegram private
chat, a web conversation, whose id is the person's) or when every message a person sent in it
came from them on this channel (a Slack DM), so nobody else's words are erased with theirs.
Shared conversations (groups, channels) belong to the chat and are not erased; the person's
words in them stay in those logs.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import orjson

from gateway.edge.scopes import Scope
from sessions.attachments import referenced
from sessions.blobs import BlobStore
from sessions.errors import SessionNotFoundError
from sessions.scan import split_lines
from sessions.store import SessionInfo, SessionStore
from sessions.tombstones import tombstone

log = logging.getLogger("gateway.erasure.eraser")


@dataclass(frozen=True, slots=True)
class Removal:
    """One thing an erasure removed: its kind (``memory``, ``session``, ...) and name."""

    kind: str
    name: str


ErasureStep = Callable[[Scope, str], Awaitable[Sequence[Removal]]]
"""Removes one kind of a person's data (the scope, and who asked: ``operator`` or ``self``);
returns what it removed (nothing: an empty list).
Contract: idempotent (erasing twice removes nothing the second time), and raises only when
it could not finish (the erasure then stops before its tombstone, and can be run again)."""


@dataclass(frozen=True, slots=True)
class ErasureReport:
    """What an erasure removed, in order: the steps' removals, then the sessions."""

    scope: Scope
    removed: tuple[Removal, ...]

    def counts(self) -> dict[str, int]:
        return dict(Counter(r.kind for r in self.removed))


class Eraser:
    """Erases people's data from the session store and whatever its steps cover."""

    def __init__(self, store: SessionStore, steps: Sequence[ErasureStep] = ()) -> None:
        self.store = store
        self.steps = list(steps)

    async def sessions_of(self, scope: Scope) -> list[str]:
        """The ids of the person's one-to-one sessions (see the module docstring)."""
        if scope.kind != "person":
            raise ValueError("only a person's sessions are erased (a chat's log is shared)")
        found: list[str] = []
        for info in await self.store.list_sessions(scope.tenant):
            if info.channel != scope.channel:
                continue
            named = Scope.from_header(info.tenant, info.scope)
            if named is not None:
                if named == scope:
                    found.append(info.session_id)
            elif info.scope is None and (info.conversation == f"{scope.channel}:{scope.id}"
                                         or await self._only_from(info, scope.id)):
                found.append(info.session_id)
        return found

    async def erase(self, scope: Scope, *, requested_by: str) -> ErasureReport:
        """Run every step, then delete the sessions and record the tombstone."""
        removed: list[Removal] = []
        for step in self.steps:
            removed.extend(await step(scope, requested_by))
        sessions = await self.sessions_of(scope)
        counts = Counter(r.kind for r in removed)
        counts["session"] += len(sessions)
        deleted = await self.store.erase(scope.tenant, sessions, tombstone(
            tenant=scope.tenant, kind=scope.kind, channel=scope.channel, ident=scope.id,
            requested_by=requested_by, sessions=sessions, removed=dict(counts),
        ))
        removed.extend(Removal("session", sid) for sid in deleted)
        log.info("erased a person's data on %s in tenant %s (%s), requested by %s",
                 scope.channel, scope.tenant,
                 ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing",
                 requested_by)
        return ErasureReport(scope, tuple(removed))

    async def _only_from(self, info: SessionInfo, person: str) -> bool:
        """True when the session has messages from a person and all are from ``person``."""
        lines, _ = split_lines(await self.store.read_log(info.tenant, info.session_id))
        senders: set[object] = set()
        for raw in lines[1:]:
            if b'"meta"' not in raw:  # only inbound messages carry who sent them
                continue
            try:
                entry = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(entry, dict) or entry.get("type") != "message":
                continue
            meta = entry.get("meta")
            if isinstance(meta, dict) and "sender" in meta:
                senders.add(meta["sender"])
        return senders == {person}


def blob_step(eraser: Eraser, blobs: BlobStore) -> ErasureStep:
    """The step that deletes the attachments of the person's one-to-one sessions (photos,
    voice notes, files; and files the agent sent them), except those another session of the
    tenant still refers to (the same photo shared in a group stays with the group's log)."""

    async def step(scope: Scope, requested_by: str) -> list[Removal]:
        mine = set(await eraser.sessions_of(scope))
        theirs: set[str] = set()
        others: set[str] = set()
        for info in await eraser.store.list_sessions(scope.tenant):
            try:
                found = referenced(await eraser.store.read_log(scope.tenant, info.session_id))
            except SessionNotFoundError:
                continue
            (theirs if info.session_id in mine else others).update(found)
        doomed = sorted(theirs - others)
        await blobs.delete(scope.tenant, doomed)
        return [Removal("blob", digest) for digest in doomed]

    return step


def rerun_step(eraser: Eraser, reruns: SessionStore) -> ErasureStep:
    """The step that deletes the rerun logs made from the person's one-to-one sessions
    (``gateway replay --rerun`` writes them beside the sessions, in a store of their own, and
    each holds a copy of the messages of the call it reran)."""

    async def step(scope: Scope, requested_by: str) -> list[Removal]:
        mine = set(await eraser.sessions_of(scope))
        if not mine:
            return []
        doomed = [info.session_id for info in await reruns.list_sessions(scope.tenant)
                  if info.conversation in mine]  # a rerun log's conversation: its session
        if not doomed:
            return []
        deleted = await reruns.erase(scope.tenant, doomed, tombstone(
            tenant=scope.tenant, kind=scope.kind, channel=scope.channel, ident=scope.id,
            requested_by=requested_by, sessions=doomed, removed={"rerun": len(doomed)},
        ))
        return [Removal("rerun", sid) for sid in deleted]

    return step


def memory_step(forget: Callable[[Scope], Awaitable[list[str]]]) -> ErasureStep:
    """The step that deletes the person's memory scope (``PersonaWorkspace.forget``)."""

    async def step(scope: Scope, requested_by: str) -> list[Removal]:
        return [Removal("memory", path) for path in await forget(scope)]

    return step
