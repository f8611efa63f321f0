"""The history port answered from the session store (and the blob store beside it).

Channels ask :class:`~gateway.edge.history.History`; this reads the log for them, so the log
format never reaches a channel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.edge.history import HistoryFile, HistoryItem, HistoryPage, StoredFile
from gateway.edge.messages import SCHEDULED, ConversationKey
from sessions.attachments import iter_refs, referenced
from sessions.blobs import BlobStore
from sessions.errors import BlobMissingError, SessionNotFoundError
from sessions.scan import message_text
from sessions.store import SessionStore


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
        scheduled=isinstance(meta := entry.get("meta"), Mapping) and SCHEDULED in meta,
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
