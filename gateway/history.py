"""The history port: what a channel may know of a conversation's past, without the log format.

Channels that show earlier messages (the web chat's ``/api/history``, the console's
``/session``) ask this seam, never the session store: the log format stays inside
``sessions/`` and a channel sees messages as people see them. :class:`StoreHistory` answers
from any :class:`~sessions.store.SessionStore`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.messages import ConversationKey
from sessions.attachments import iter_refs, referenced
from sessions.blobs import BlobStore
from sessions.errors import BlobMissingError, SessionNotFoundError
from sessions.scan import message_text
from sessions.store import SessionStore


@dataclass(frozen=True, slots=True)
class HistoryFile:
    """A file in a message: one the person attached, or (``sent``) one the agent sent."""

    name: str
    media_type: str
    size: int
    hash: str
    sent: bool = False


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file's bytes, for a channel that serves it back (the web chat's download links)."""

    name: str
    media_type: str
    data: bytes


@dataclass(frozen=True, slots=True)
class HistoryItem:
    """One message as a person saw it; ``text`` is None for tool calls and tool results."""

    seq: int | None
    ts: str | None
    role: str | None
    text: str | None
    files: tuple[HistoryFile, ...] = ()


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """A page of the conversation's current session (``session`` None: nothing yet)."""

    session: str | None
    total: int
    offset: int
    items: tuple[HistoryItem, ...]


class History(Protocol):
    """Read-only view of conversations' current sessions.

    Contract: never writes; a conversation without a session (or whose session went away
    meanwhile) is an empty page, not an error. Store faults propagate as the store raises them.
    :meth:`file` returns a file only if the conversation's current session refers to it (a
    hash alone opens nothing), else None.
    """

    async def current_session(self, key: ConversationKey) -> str | None: ...

    async def page(self, key: ConversationKey, offset: int, limit: int) -> HistoryPage: ...

    async def file(self, key: ConversationKey, digest: str) -> StoredFile | None: ...


class StoreHistory:
    """:class:`History` over a session store (and the blob store beside it)."""

    def __init__(self, store: SessionStore, blobs: BlobStore | None = None) -> None:
        self._store = store
        self._blobs = blobs

    async def current_session(self, key: ConversationKey) -> str | None:
        return await self._store.latest_session(key.tenant, key.label())

    async def page(self, key: ConversationKey, offset: int, limit: int) -> HistoryPage:
        session = await self.current_session(key)
        empty = HistoryPage(None, 0, offset, ())
        if session is None:
            return empty
        try:
            page = await self._store.message_page(key.tenant, session, offset, limit)
        except SessionNotFoundError:
            return empty
        return HistoryPage(session, page.total, page.offset,
                           tuple(_item(entry) for entry in page.messages))

    async def file(self, key: ConversationKey, digest: str) -> StoredFile | None:
        session = await self.current_session(key)
        if session is None or self._blobs is None:
            return None
        try:
            log = await self._store.read_log(key.tenant, session)
        except SessionNotFoundError:
            return None
        if digest not in referenced(log):
            return None
        found = None
        for item in _files_in(log):
            if item.hash == digest:
                found = item
                break
        try:
            data = await self._blobs.get(key.tenant, digest)
        except BlobMissingError:
            return None
        name, media_type = (found.name, found.media_type) if found else ("file", "")
        return StoredFile(name, media_type or "application/octet-stream", data)


def _item(entry: Mapping[str, Any]) -> HistoryItem:
    message = entry.get("message")
    message = message if isinstance(message, Mapping) else {}
    seq, ts, role = entry.get("seq"), entry.get("ts"), message.get("role")
    return HistoryItem(
        seq=seq if isinstance(seq, int) else None,
        ts=ts if isinstance(ts, str) else None,
        role=role if isinstance(role, str) else None,
        text=message_text(message.get("content")),
        files=tuple(HistoryFile(ref.name, ref.media_type, ref.size, ref.hash, sent)
                    for ref, sent in iter_refs(message.get("content"))),
    )


def _files_in(log: bytes) -> list[HistoryFile]:
    """Every file the messages of a log refer to (for the name and type of one)."""
    files: list[HistoryFile] = []
    for line in log.split(b"\n"):
        if b'"attachment"' not in line or not line.startswith(b'{"type":"message"'):
            continue
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # replay reports corrupt lines; here they just hold no file
        if isinstance(entry, dict):
            files.extend(_item(entry).files)
    return files
