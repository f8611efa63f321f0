"""Which schedules have work due, without a walk over all of them: the file store's index.

The file store (:mod:`sessions.schedule_file`) keeps every schedule in memory; with 10,000 of
them, finding the earliest due time by looking at each one cost about 15 ms on a busy machine,
and a firing round asked three times. This index answers in O(log n): two heaps of
``(time, ...)`` entries, one for the schedules waiting for their next occurrence (active,
nothing claimed: by ``next_at``), one for the claimed occurrences waiting to be delivered (by
``held_until``, else the occurrence).

Entries are never updated in place: a changed record gets a new entry (:meth:`DueIndex.note`)
and the old one goes stale. A stale entry (its record gone, or no longer at that time) is
dropped when it reaches the top of its heap, and the heaps are rebuilt once stale entries
outnumber the records, so they stay within a small factor of the records' count.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sessions.schedules import ScheduleRecord

Key = tuple[str, str]
E = TypeVar("E", bound=tuple[Any, ...])
_Waiting = tuple[float, str, str]  # (next_at, id, tenant)
_Claimed = tuple[float, float, str, str]  # (held_until or firing, firing, id, tenant)
REBUILD_SLACK = 1024
"""Stale entries allowed beyond the records' count before the heaps are rebuilt."""


def waiting_time(record: ScheduleRecord) -> float | None:
    """When ``record`` is next due to be claimed, or None (ended, or claimed already)."""
    if record.state == "active" and record.firing is None:
        return record.next_at
    return None


def claimed_time(record: ScheduleRecord) -> float | None:
    """When ``record``'s claimed occurrence may be delivered, or None (nothing claimed)."""
    if record.firing is None:
        return None
    return record.held_until or record.firing


class DueIndex:
    """See the module docstring. ``records`` is the store's own mapping, read (never
    changed) to tell a stale entry from a current one."""

    def __init__(self, records: Mapping[Key, ScheduleRecord]) -> None:
        self.records = records
        self._waiting: list[_Waiting] = []
        self._claimed: list[_Claimed] = []
        self.rebuild()

    def rebuild(self) -> None:
        """Entries for every record as it is now, and no stale ones."""
        self._waiting = [(t, r.id, r.tenant) for r in self.records.values()
                         if (t := waiting_time(r)) is not None]
        self._claimed = [(t, r.firing or 0.0, r.id, r.tenant) for r in self.records.values()
                         if (t := claimed_time(r)) is not None]
        heapq.heapify(self._waiting)
        heapq.heapify(self._claimed)

    @property
    def entries(self) -> int:
        """Entries the heaps hold, stale ones included (at most about twice the records)."""
        return len(self._waiting) + len(self._claimed)

    def note(self, record: ScheduleRecord) -> None:
        """``record`` was stored as it is now (its older entries go stale)."""
        if (t := waiting_time(record)) is not None:
            heapq.heappush(self._waiting, (t, record.id, record.tenant))
        if (t := claimed_time(record)) is not None:
            heapq.heappush(self._claimed, (t, record.firing or 0.0, record.id, record.tenant))
        if self.entries > 2 * len(self.records) + REBUILD_SLACK:
            self.rebuild()

    def earliest(self) -> tuple[float | None, float | None]:
        """(the earliest ``next_at`` waiting to be claimed, the earliest time a claimed
        occurrence may be delivered)."""
        _clean(self._waiting, self._live_waiting)
        _clean(self._claimed, self._live_claimed)
        return (self._waiting[0][0] if self._waiting else None,
                self._claimed[0][0] if self._claimed else None)

    def waiting_due(self, now: float, limit: int) -> list[ScheduleRecord]:
        """At most ``limit`` records waiting with ``next_at <= now``, earliest first (by
        time, then id). Their entries are taken out: the caller claims them (and notes
        them again) or, if that fails, rebuilds the index."""
        found: list[ScheduleRecord] = []
        seen: set[Key] = set()
        while self._waiting and len(found) < limit:
            _clean(self._waiting, self._live_waiting)
            if not self._waiting or self._waiting[0][0] > now:
                break
            _, ident, tenant = heapq.heappop(self._waiting)
            if (tenant, ident) not in seen:  # a record noted twice at the same time
                seen.add((tenant, ident))
                found.append(self.records[(tenant, ident)])
        return found

    def claimed_due(self, now: float, limit: int) -> list[ScheduleRecord]:
        """At most ``limit`` claimed records that may be delivered at ``now``, oldest
        occurrence first (then id). The entries stay (the records are changed by the
        delivery, which notes them again)."""
        taken: list[_Claimed] = []
        found: dict[Key, ScheduleRecord] = {}
        while True:
            _clean(self._claimed, self._live_claimed)
            if not self._claimed or self._claimed[0][0] > now:
                break
            entry = heapq.heappop(self._claimed)
            taken.append(entry)
            found[(entry[3], entry[2])] = self.records[(entry[3], entry[2])]
        for entry in taken:
            heapq.heappush(self._claimed, entry)
        return sorted(found.values(), key=lambda r: (r.firing or 0.0, r.id))[:limit]

    def _live_waiting(self, entry: _Waiting) -> bool:
        record = self.records.get((entry[2], entry[1]))
        return record is not None and waiting_time(record) == entry[0]

    def _live_claimed(self, entry: _Claimed) -> bool:
        record = self.records.get((entry[3], entry[2]))
        return (record is not None and record.firing == entry[1]
                and claimed_time(record) == entry[0])


def _clean(heap: list[E], live: Callable[[E], bool]) -> None:
    """Drop stale entries from the top of ``heap``."""
    while heap and not live(heap[0]):
        heapq.heappop(heap)
