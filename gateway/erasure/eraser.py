"""Erasure on request: everything the gateway keeps of a person, then a tombstone.

:class:`Eraser` is what ``gateway forget`` and the ``/forget`` chat command run (through
:class:`gateway.erasure.service.ErasureService`, which first holds the person's conversations
still wherever they are served). It works in two passes:

1. **Plan** (reads only): their one-to-one sessions (deleted whole), their messages in shared
   conversations (each replaced by a marker, :mod:`sessions.erased`, in a log that stays the
   chat's), the ids of the items those messages were (the owed journal's and the inbox's
   records of them), and what every **step** would remove (the memory scope's files, the
   attachments only they referred to, rerun logs made from those sessions, ...).
2. **Execute**: the store deletes and rewrites the sessions and records one tombstone naming
   how many things of each kind go, all or nothing (:meth:`sessions.store.SessionStore.erase`:
   a session another process holds open refuses the whole erasure before anything changes);
   then each step removes what it found. Every step is idempotent, so an erasure a later
   step failed in can be run again and finishes.

To erase a new kind of data, add a step (:class:`ErasureStep`) where the composition root
builds the eraser; nothing else changes.

Whose sessions are they? A session whose header names the person's scope (every session
since scopes: the registry records it). Sessions written before name none; one of those is
the person's when its conversation is named after them (``CHANNEL:ID``: a Telegram private
chat, a web conversation, whose id is the person's) or when every message a person sent in it
came from them on this channel (a Slack DM), so nobody else's words are erased with theirs.
Shared conversations (groups, channels) belong to the chat: their logs stay, with the person's
own messages replaced by markers. What others (and the model) said there stays too, and so
does the chat's memory.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from gateway.edge.scopes import Scope
from sessions.erased import marker_line
from sessions.errors import SessionNotFoundError
from sessions.names import utc_now_iso
from sessions.scan import split_lines
from sessions.store import SessionInfo, SessionStore
from sessions.tombstones import subject_hash, tombstone

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Removal:
    """One thing an erasure removed: its kind (``memory``, ``session``, ...) and name."""

    kind: str
    name: str


@dataclass(frozen=True, slots=True)
class ErasurePlan:
    """What an erasure of ``scope`` changes in the session store (see the module docstring)."""

    scope: Scope
    sessions: tuple[str, ...]
    """Their one-to-one sessions: deleted."""
    rewrites: Mapping[str, Mapping[int, bytes]]
    """Shared sessions that stay: ``seq`` -> the marker line replacing their message."""
    items: frozenset[str]
    """The item ids of their messages (``meta.item``): what is owed or answered of them."""
    logs: Mapping[str, bytes] = field(default_factory=dict)
    """Every session of the tenant read while planning, as it will be after the erasure
    (erased ones left out, shared ones with their markers): what steps look things up in."""

    @property
    def touched(self) -> frozenset[str]:
        """Every session the erasure deletes or rewrites (copies of them must be dropped)."""
        return frozenset(self.sessions) | frozenset(self.rewrites)

    @property
    def messages(self) -> int:
        return sum(len(lines) for lines in self.rewrites.values())


class ErasureStep(Protocol):
    """Removes one kind of a person's data.

    Contract: :meth:`find` only reads, and says what :meth:`remove` would remove (so the
    tombstone and a dry run can count it before anything is deleted); :meth:`remove` removes
    it and returns what it did remove. Both are idempotent (erasing twice removes nothing the
    second time); :meth:`remove` raises only when it could not finish, and can be run again.
    """

    async def find(self, plan: ErasurePlan) -> list[Removal]: ...

    async def remove(self, plan: ErasurePlan, found: list[Removal],
                     requested_by: str) -> list[Removal]: ...


@dataclass(frozen=True, slots=True)
class ErasureReport:
    """What an erasure removed, in order: the sessions and messages, then each step's."""

    scope: Scope
    removed: tuple[Removal, ...]
    elsewhere: tuple[Removal, ...] = ()
    """What the other workers removed of their own as the erasure let them go (their MCP
    logs, ``<worker>:<file>``), or could not: not in the tombstone, which was written before."""

    def counts(self) -> dict[str, int]:
        return dict(Counter(r.kind for r in self.removed))


class Eraser:
    """Erases people's data from the session store and whatever its steps cover."""

    def __init__(self, store: SessionStore, steps: Sequence[ErasureStep] = ()) -> None:
        self.store = store
        self.steps = list(steps)

    async def sessions_of(self, scope: Scope) -> list[str]:
        """The ids of the person's one-to-one sessions (see the module docstring)."""
        return list((await self.plan(scope, shared=False)).sessions)

    async def plan(self, scope: Scope, *, shared: bool = True) -> ErasurePlan:
        """What erasing ``scope`` changes in the store (reads only). ``shared=False``: the
        one-to-one sessions alone (no shared log is read)."""
        if scope.kind != "person":
            raise ValueError("only a person's sessions are erased (a chat's log is shared)")
        subject = subject_hash(scope.tenant, scope.channel, scope.id)
        at = utc_now_iso()
        mine: list[str] = []
        rewrites: dict[str, dict[int, bytes]] = {}
        items: set[str] = set()
        logs: dict[str, bytes] = {}
        for info in await self.store.list_sessions(scope.tenant):
            named = Scope.from_header(info.tenant, info.scope)
            ours = info.channel == scope.channel
            if ours and named is not None and named.kind == "person":
                if named == scope:
                    mine.append(info.session_id)
                    items.update(_items(await self._read(info)))
                elif shared:
                    logs[info.session_id] = await self._read(info)
                continue
            if not shared and not (ours and named is None):
                continue
            data = await self._read(info)
            if ours and named is None and (info.conversation == f"{scope.channel}:{scope.id}"
                                           or _senders(data) == {scope.id}):
                mine.append(info.session_id)
                items.update(_items(data))
                continue
            found = _messages_from(data, scope.id) if ours else {}
            if found:
                rewrites[info.session_id] = {
                    seq: marker_line(entry, subject=subject, at=at)
                    for seq, entry in found.items()}
                items.update(_items_of(found.values()))
                data = _with_lines(data, rewrites[info.session_id])
            logs[info.session_id] = data
        return ErasurePlan(scope, tuple(mine), rewrites, frozenset(items), logs)

    async def find(self, plan: ErasurePlan) -> list[list[Removal]]:
        """What each step would remove (reads only), in step order."""
        return [await step.find(plan) for step in self.steps]

    async def erase(self, scope: Scope, *, requested_by: str,
                    plan: ErasurePlan | None = None) -> ErasureReport:
        """Plan (unless given), count, erase the sessions and record the tombstone, then run
        every step. Nothing is removed when the store refuses (a session held open)."""
        plan = plan or await self.plan(scope)
        found = await self.find(plan)
        counts = Counter(r.kind for removals in found for r in removals)
        counts["session"] += len(plan.sessions)
        if plan.messages:
            counts["message"] += plan.messages
        deleted = await self.store.erase(scope.tenant, plan.sessions, tombstone(
            tenant=scope.tenant, kind=scope.kind, channel=scope.channel, ident=scope.id,
            requested_by=requested_by, sessions=plan.sessions, removed=dict(counts),
        ), plan.rewrites)
        removed = [Removal("session", sid) for sid in deleted]
        removed += [Removal("message", f"{sid}#{seq}")
                    for sid, lines in sorted(plan.rewrites.items()) for seq in sorted(lines)]
        for step, removals in zip(self.steps, found, strict=True):
            removed.extend(await step.remove(plan, removals, requested_by))
        report = ErasureReport(scope, tuple(removed))
        log.info("erased a person's data on %s in tenant %s (%s), requested by %s",
                 scope.channel, scope.tenant,
                 ", ".join(f"{n} {k}" for k, n in sorted(report.counts().items()))
                 or "nothing", requested_by)
        return report

    async def _read(self, info: SessionInfo) -> bytes:
        try:
            return await self.store.read_log(info.tenant, info.session_id)
        except SessionNotFoundError:  # deleted since the listing (pruned, erased)
            return b""


def _entries(data: bytes) -> list[dict[str, Any]]:
    """The inbound message entries of a log (the only ones that carry ``meta``)."""
    lines, _ = split_lines(data)
    found: list[dict[str, Any]] = []
    for raw in lines[1:]:
        if b'"meta"' not in raw:
            continue
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("type") == "message" and isinstance(
                entry.get("meta"), dict):
            found.append(entry)
    return found


def _senders(data: bytes) -> set[object]:
    return {e["meta"]["sender"] for e in _entries(data) if "sender" in e["meta"]}


def _messages_from(data: bytes, person: str) -> dict[int, dict[str, Any]]:
    """``seq`` -> entry of every message ``person`` sent in a log (that is not a marker)."""
    return {e["seq"]: e for e in _entries(data)
            if str(e["meta"].get("sender")) == person and isinstance(e.get("seq"), int)
            and "erased" not in e}


def _items(data: bytes) -> set[str]:
    return _items_of(_entries(data))


def _items_of(entries: Any) -> set[str]:
    return {str(e["meta"]["item"]) for e in entries if isinstance(e["meta"].get("item"), str)}


def _with_lines(data: bytes, lines: Mapping[int, bytes]) -> bytes:
    """``data`` with the lines of these ``seq`` replaced (what the log will be)."""
    out: list[bytes] = []
    for raw in data.split(b"\n"):
        if raw and b'"meta"' in raw:
            try:
                seq = orjson.loads(raw).get("seq")
            except (orjson.JSONDecodeError, AttributeError):
                seq = None
            if isinstance(seq, int) and seq in lines:
                raw = lines[seq]
        out.append(raw)
    return b"\n".join(out)
