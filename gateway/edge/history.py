"""The history port: what a channel may know of a conversation's past, without the log format.

Channels that show earlier messages (the web chat's ``/api/history``, the console's
``/session``) ask this seam, never the session store: the log format stays inside
``sessions/`` and a channel sees messages as people see them. The answer from the session store is
:class:`gateway.delivery.history.StoreHistory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.edge.messages import ConversationKey


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
    """One message as a person saw it; ``text`` is None for tool calls and tool results.
    ``scheduled``: the trigger of a scheduled turn (a reminder firing), which nobody typed."""

    seq: int | None
    ts: str | None
    role: str | None
    text: str | None
    files: tuple[HistoryFile, ...] = ()
    scheduled: bool = False


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
