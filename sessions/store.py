"""The session store seam: what the agent loop, router, CLI and viewer need from storage.

Two Protocols: :class:`SessionStore` (find, create, open, list, read sessions) and
:class:`SessionWriter` (the single writer of one session's append-only log). The JSONL backend is
:mod:`sessions.jsonl`; other backends (PostgreSQL) implement the same contract and must produce
the same entry bodies, so replay and every tool above it work unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Durability = Literal["none", "turn", "always"]
DURABILITY_LEVELS: tuple[Durability, ...] = ("none", "turn", "always")


@dataclass(slots=True)
class SessionState:
    """What a writer knows about its log, recovered on resume so nothing is written twice."""

    next_seq: int = 0
    message_count: int = 0
    call_count: int = 0
    last_prompt: str | None = None
    last_tools: str | None = None
    sections: set[str] = field(default_factory=set)
    tool_sets: set[str] = field(default_factory=set)

    def advance(self, item: Mapping[str, Any]) -> None:
        """Take one accepted entry into account (every backend calls this per entry)."""
        kind = item.get("type")
        if kind == "message":
            self.message_count += 1
        elif kind == "section":
            self.sections.add(item["hash"])
        elif kind == "prompt":
            self.last_prompt = item["fingerprint"]
        elif kind == "tools":
            self.tool_sets.add(item["fingerprint"])
        elif kind == "call":
            self.call_count = max(self.call_count, int(item["call"]) + 1)
            self.last_tools = item.get("tools")


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One row of a session listing."""

    session_id: str
    tenant: str
    started_at: str | None
    channel: str | None
    conversation: str | None
    version: int | None
    message_count: int
    first_user_text: str | None
    size_bytes: int
    modified: float
    torn: bool = False
    error: str | None = None
    scope: Mapping[str, Any] | None = None
    """The header's ``scope`` (whose memory scope the conversation has), if it names one."""
    generation: int = 0
    """The header's ``generation`` (:mod:`sessions.order`); 0 for sessions written before it."""
    scheduled: int = 0
    """Scheduled turns in it: user messages whose ``meta`` names a schedule."""


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """Per tenant, the Unix time before which its sessions go: ``tenants``' own, else
    ``default`` (``None``: kept). :class:`sessions.retention.RetentionPolicy` makes them."""

    default: float | None = None
    tenants: Mapping[str, float | None] = field(default_factory=dict)

    def __call__(self, tenant: str) -> float | None:
        return self.tenants.get(tenant, self.default)


@dataclass(frozen=True, slots=True)
class Pruned:
    """A session retention removed, or kept (``kept`` says why: a live writer holds it...),
    or, in a dry run, would remove (``kept`` None)."""

    tenant: str
    session_id: str
    size_bytes: int
    modified: float
    kept: str | None = None


@dataclass(frozen=True, slots=True)
class MessagePage:
    """A page of message entries (never prompt, section, tools, call or outcome entries):
    each ``seq``, ``ts`` and ``message``, and ``meta`` when the entry has one (what the
    channel or the gateway noted with it: a scheduled turn's trigger says so there)."""

    session_id: str
    total: int
    offset: int
    messages: tuple[Mapping[str, Any], ...]


def page_item(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A message entry as a :class:`MessagePage` holds it."""
    item = {"seq": entry.get("seq"), "ts": entry.get("ts"), "message": entry.get("message")}
    meta = entry.get("meta")
    return {**item, "meta": meta} if isinstance(meta, Mapping) and meta else item


class SessionWriter(Protocol):
    """The one writer of a session log.

    Contract: :meth:`append` first *accepts* the given entries (consecutive ``seq`` numbers,
    ``state`` advanced) or *refuses* them (closed, broken, fenced off, unencodable: ``state``
    untouched), and decides that before its first suspension, so entries are accepted in the
    order :meth:`append` is called and a timeout around it can only fire after acceptance.
    Accepted entries are written as whole lines, in order. If the write fails it raises
    :class:`~sessions.errors.SessionWriteError` (``accepted=True``) with the log still ending
    on a whole line and none of these entries on disk; they are kept and written, with their
    original ``seq`` and ``ts``, ahead of the next append (so message indices stay aligned with
    later call windows). A refusal raises with ``accepted=False``. Appends from one writer
    never interleave.
    :meth:`flush` waits until everything accepted so far is in the log (written, not
    necessarily durable), raising ``SessionWriteError(accepted=True)`` while it cannot be:
    the gateway flushes before it acknowledges a message or sends an answer.
    :meth:`sync` also makes it durable (per the store's durability setting).
    :meth:`aclose` is idempotent and releases the writer lock even if the final sync fails.
    """

    @property
    def session_id(self) -> str: ...

    @property
    def tenant(self) -> str: ...

    @property
    def state(self) -> SessionState: ...

    async def append(self, entries: Sequence[Mapping[str, Any]]) -> int:
        """Append entries; return the number of bytes written."""
        ...

    @property
    def pending_bytes(self) -> int:
        """Bytes of accepted entries not in the log yet (queued, or kept after a failure)."""
        ...

    async def flush(self) -> None: ...

    async def sync(self) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class LogImporter(Protocol):
    """A store that can take whole JSONL logs (``gateway sessions import``)."""

    async def import_log(self, tenant: str, data: bytes, *,
                         fallback_id: str | None = None) -> Any: ...


class SessionStore(Protocol):
    """Creates, resumes, lists and reads sessions. Names are validated before any use."""

    async def create(
        self,
        *,
        tenant: str,
        channel: str,
        conversation: str,
        session_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> SessionWriter:
        """Start a new session (header written) and return its writer."""
        ...

    async def open(self, tenant: str, session_id: str) -> SessionWriter:
        """Resume an existing session for appending; a torn last line is repaired first."""
        ...

    async def exists(self, tenant: str, session_id: str) -> bool: ...

    async def latest_session(self, tenant: str, conversation: str) -> str | None:
        """Id of the newest session whose header names ``conversation``, if any: the one
        created last (:mod:`sessions.order`), whatever the start times say."""
        ...

    async def list_sessions(self, tenant: str | None = None) -> list[SessionInfo]:
        """Sessions of one tenant (``None``: every tenant), newest first; a conversation's
        own in creation order (:func:`sessions.order.newest_first`)."""
        ...

    async def read_log(self, tenant: str, session_id: str) -> bytes:
        """The whole log as JSONL bytes, exactly as replay reads it."""
        ...

    async def message_page(
        self, tenant: str, session_id: str, offset: int = 0, limit: int = 50
    ) -> MessagePage: ...

    async def erase(self, tenant: str, session_ids: Sequence[str],
                    tombstone: Mapping[str, Any],
                    rewrites: Mapping[str, Mapping[int, bytes]] | None = None) -> list[str]:
        """Delete these sessions, every entry of them, and record ``tombstone`` (a body from
        :func:`sessions.tombstones.tombstone`) for the tenant; returns the ids deleted.

        ``rewrites``: sessions that stay (a group's) with some lines replaced, by ``seq``
        (the erased person's messages, as :func:`sessions.erased.marker_line` renders them);
        an entry whose ``seq`` is not in the log is skipped, a session that is gone too.
        They are locked and changed with the deletions: all of it, or nothing.

        Contract: names are validated before anything changes. An id with no session is
        skipped (erasing twice is harmless). A session that a live writer of *another process*
        holds is refused (:class:`~sessions.errors.SessionLockedError`) before anything is
        deleted, where the backend can tell (JSONL: its ``flock``; PostgreSQL cannot, and a
        fenced writer's next append fails instead). The tombstone is recorded even when
        nothing was left to delete, and once it is recorded the sessions are gone: no read,
        listing or ``latest_session`` of this store returns them again. PostgreSQL does it
        in one transaction; JSONL locks every file first, rewrites (a new file renamed into
        place), deletes, then appends the tombstone (a crash in between leaves the sessions
        deleted and no tombstone: erase again).
        """
        ...

    async def tombstones(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """The tombstones of one tenant (``None``: every tenant), oldest first."""
        ...

    async def prune(self, cutoffs: Cutoffs, *, dry: bool = False) -> list[Pruned]:
        """Delete every session last modified before its tenant's cutoff; ``dry``: delete
        nothing. Each such session comes back, with ``kept`` saying why one stayed.

        Contract: a session a live writer holds is kept where the backend can tell (JSONL:
        its ``flock``, this process's writers included); PostgreSQL cannot, and a writer of
        a session deleted under it finds it gone at its next append (``NOT_FOUND``: the
        conversation goes on in a new session). Retention (:mod:`sessions.retention`) calls
        it; the bytes of the files those sessions sent go afterwards, once unreferenced.
        """
        ...

    async def aclose(self) -> None: ...
