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

from gateway.messages import ConversationKey
from sessions.errors import SessionNotFoundError
from sessions.scan import message_text
from sessions.store import SessionStore


@dataclass(frozen=True, slots=True)
class HistoryItem:
    """One message as a person saw it; ``text`` is None for tool calls and tool results."""

    seq: int | None
    ts: str | None
    role: str | None
    text: str | None


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
    """

    async def current_session(self, key: ConversationKey) -> str | None: ...

    async def page(self, key: ConversationKey, offset: int, limit: int) -> HistoryPage: ...


class StoreHistory:
    """:class:`History` over a session store."""

    def __init__(self, store: SessionStore) -> None:
        self._store = store

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


def _item(entry: Mapping[str, Any]) -> HistoryItem:
    message = entry.get("message")
    message = message if isinstance(message, Mapping) else {}
    seq, ts, role = entry.get("seq"), entry.get("ts"), message.get("role")
    return HistoryItem(
        seq=seq if isinstance(seq, int) else None,
        ts=ts if isinstance(ts, str) else None,
        role=role if isinstance(role, str) else None,
        text=message_text(message.get("content")),
    )
