"""The schedule store seam: where schedules live, and the two steps that fire them once.

Backends: a file of its own under the data folder (:mod:`sessions.schedule_file`, one gateway
process) and a PostgreSQL table beside the sessions (:mod:`sessions.postgres.schedules`,
shared by every worker). Both keep :class:`~sessions.schedules.ScheduleRecord` s.

**Firing exactly once** is two steps, each one write:

1. :meth:`ScheduleStore.claim`: every active schedule whose ``next_at`` has come and that has
   nothing claimed is handed to ``plan`` (pure: :func:`gateway.schedule.triggers.plan`), which
   sets ``firing`` to the occurrence (or records it skipped, when it is later than the grace
   period) and moves ``next_at`` on. The store writes the results in one transaction.
2. :meth:`ScheduleStore.deliver`: every schedule with a ``firing`` occurrence (not
   ``held_until`` a later time) is handed to ``deliver``, which records it owed to its
   conversation (the router's ``deliver``: the owed journal, or the ``inbox`` table) and
   returns the record with ``firing`` cleared and the outcome kept (or ``held_until`` set,
   to try again). The store writes that back.

With several workers each step takes only rows no other worker holds (PostgreSQL ``FOR
UPDATE SKIP LOCKED``): a schedule is claimed by one worker, and delivered by one worker at a
time. A worker killed while delivering leaves ``firing`` set (its transaction is rolled
back, its locks released at once), so another delivers it again; the owed item's platform id
is ``schedule:<id>:<occurrence>``, which the owed queue's one dedup step refuses a second
time. So an occurrence is owed exactly once, and from there it is answered like any message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from sessions.schedules import ScheduleRecord

Plan = Callable[[ScheduleRecord, float], ScheduleRecord]
"""A due record and the time now -> the record claimed (pure; no I/O)."""
Deliver = Callable[[ScheduleRecord], Awaitable[ScheduleRecord]]
"""A record with ``firing`` set -> the record after its delivery (or held for later)."""


class ScheduleStore(Protocol):
    """Durable schedules, and per-person time zones. Every method raises ``OSError`` or a
    :class:`~sessions.errors.SessionError` when the backend cannot be reached, and changes
    nothing then. :meth:`aclose` is idempotent."""

    async def add(self, record: ScheduleRecord, *, per_owner: int, per_tenant: int) -> None:
        """Store a new schedule, unless its owner already has ``per_owner`` active ones or
        its tenant ``per_tenant`` (0: no limit): then
        :class:`~sessions.schedules.ScheduleLimitError`, atomically with the count."""
        ...

    async def put(self, record: ScheduleRecord) -> None:
        """Store ``record``, replacing the one with its tenant and id (the heartbeat's)."""
        ...

    async def get(self, tenant: str, schedule_id: str) -> ScheduleRecord | None: ...

    async def find(self, tenant: str | None = None, *, owner: str | None = None,
                   active_only: bool = True) -> list[ScheduleRecord]:
        """Schedules (of ``tenant``, of ``owner``), oldest first."""
        ...

    async def cancel(self, tenant: str, schedule_id: str, *,
                     owner: str | None = None) -> ScheduleRecord | None:
        """Cancel an active schedule (only ``owner``'s, when given); the cancelled record,
        or ``None`` when there is no such active schedule. An occurrence already claimed is
        still delivered (it may be owed already)."""
        ...

    async def erase_person(self, tenant: str, channel: str, person: str) -> list[str]:
        """Delete every schedule :func:`~sessions.schedules.belongs_to` the person, and their
        time zone; the ids deleted. Idempotent."""
        ...

    async def zone(self, tenant: str, person: str) -> str | None:
        """The time zone a person chose (``person``: ``CHANNEL:ID``), if any."""
        ...

    async def set_zone(self, tenant: str, person: str, zone: str | None) -> None: ...

    async def claim(self, now: float, plan: Plan, limit: int) -> int:
        """Step 1 (see the module docstring): at most ``limit`` due schedules; how many."""
        ...

    async def deliver(self, now: float, deliver: Deliver, limit: int) -> int:
        """Step 2: at most ``limit`` claimed occurrences; how many were handed over."""
        ...

    async def next_due(self) -> float | None:
        """When the next step has work: the earliest ``next_at`` of an active schedule with
        nothing claimed, or ``held_until`` (or now) of a claimed one; ``None``: no work."""
        ...

    async def aclose(self) -> None: ...
