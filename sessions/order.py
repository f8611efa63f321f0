"""The order of a conversation's sessions: the order they were created in.

A new session's header records its ``generation``: 1 for the first session of a conversation,
else one more than the generation of the conversation's latest session at its creation. The
latest session of a conversation is the one with the highest generation; the start time, then
the id, only break ties and order the sessions written before the field (generation 0, ordered
as they always were). Start times alone cannot say which session came last: two sessions
started within one millisecond (``/new`` right after a first message, a rotation right after
a takeover) have the same one, which left it to the random part of their ids; the clocks of
two workers differ; and a clock can step back.

Every backend, its listing and every tool that picks "the newest session of a conversation"
orders by :func:`session_key`, so they agree after a restart, across workers, and with what a
gateway that is still running remembers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sessions.store import SessionInfo

GENERATION = "generation"
"""The header field (see ``docs/session-format.md``)."""

SessionKey = tuple[int, str, str]
"""``(generation, startedAt, id)`` of a session: of one conversation's, the greatest is the
latest."""


def generation_of(header: Mapping[str, Any]) -> int:
    """The header's generation; 0 when it has none (written before the field) or an odd one."""
    value = header.get(GENERATION)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 0


def session_key(header: Mapping[str, Any], session_id: str) -> SessionKey | None:
    """Where the session stands among its conversation's; None without a start time (such a
    header names no session any lookup can pick, as before the field)."""
    started = header.get("startedAt")
    if not isinstance(started, str):
        return None
    return (generation_of(header), started, session_id)


def next_generation(latest: SessionKey | None) -> int:
    """The generation of a session created while ``latest`` is its conversation's latest."""
    return 1 if latest is None else latest[0] + 1


def newest_first(infos: Iterable[SessionInfo]) -> list[SessionInfo]:
    """A listing newest first: by start time (then last change), except that the sessions of
    one conversation keep their creation order among themselves, taking the places their start
    times gave the conversation. So the first row of a conversation is the session it goes on
    in (``latest_session``), whatever the clocks of the workers that created them said."""
    rows = sorted(infos, key=lambda i: (i.started_at or "", i.modified), reverse=True)
    places: dict[tuple[str, str], list[int]] = {}
    for place, info in enumerate(rows):
        if info.conversation is not None and info.started_at is not None:
            places.setdefault((info.tenant, info.conversation), []).append(place)
    ordered = list(rows)
    for taken in places.values():
        if len(taken) > 1:
            mine = sorted((rows[p] for p in taken), reverse=True,
                          key=lambda i: (i.generation, i.started_at or "", i.session_id))
            for place, info in zip(taken, mine, strict=True):
                ordered[place] = info
    return ordered
