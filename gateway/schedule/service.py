"""Creating, listing and cancelling schedules in one owner's scope, with limits and zones.

What the chat tools, ``/reminders`` and ``gateway schedule`` share. In chat, the owner is the
conversation's memory scope (:func:`gateway.edge.scopes.scope_of`): a person's in a one-to-
one chat, the chat's in a group; a schedule set there speaks only in that conversation, and
only that owner lists or cancels it. The operator's owner is ``tenant``.

Time zones: a person's own setting (``/reminders timezone Europe/Berlin``), else their
tenant's (``GATEWAY_TENANT_TIMEZONES``), else ``GATEWAY_TIMEZONE`` (default UTC).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from gateway.schedule import triggers
from gateway.schedule.clock import Clock
from gateway.schedule.store import ScheduleStore
from sessions.schedules import ScheduleRecord, Target, TriggerKind

log = logging.getLogger(__name__)

MAX_INSTRUCTION_CHARS = 2000
OPERATOR = "operator"
TENANT_OWNER = "tenant"


@dataclass(frozen=True, slots=True)
class ScheduleSettings:
    """``GATEWAY_SCHEDULE_*`` and the zones (see ``config.example.env``). 0: no limit."""

    grace: float = 3600.0
    """An occurrence claimed later than this after its time is skipped (and recorded)."""
    per_owner: int = 25
    per_tenant: int = 2000
    min_interval: float = 300.0
    """The shortest gap between the occurrences of a schedule people set in chat."""
    poll: float = 1.0
    """Seconds between looks at the store for schedules other workers (or the CLI) added."""
    batch: int = 200
    proactive_per_minute: int = 0
    """Scheduled turns per tenant per minute (0: no limit); more wait their turn."""
    default_zone: str = "UTC"
    tenant_zones: Mapping[str, str] = field(default_factory=dict)


def new_schedule_id() -> str:
    """``s`` and 8 hex digits: short enough to type in ``/reminders cancel``."""
    return f"s{secrets.token_hex(4)}"


class Schedules:
    """See the module docstring. ``wake`` is called after a change (the scheduler's, so a
    reminder due sooner than its next look is not waited for)."""

    def __init__(self, store: ScheduleStore, settings: ScheduleSettings, clock: Clock,
                 wake: Callable[[], None] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.wake = wake

    async def zone_for(self, tenant: str, person: str | None) -> str:
        """The zone a person's times are read in (``person``: ``CHANNEL:ID``)."""
        if person is not None:
            own = await self.store.zone(tenant, person)
            if own is not None:
                return own
        return self.settings.tenant_zones.get(tenant, self.settings.default_zone)

    async def create(self, *, tenant: str, owner: str, target: Target, created_by: str,
                     instruction: str, when: str | None = None, every: str | None = None,
                     cron: str | None = None, zone: str, operator: bool = False,
                     schedule_id: str | None = None) -> ScheduleRecord:
        """A new active schedule; :class:`~gateway.schedule.triggers.TriggerError` for a
        trigger that cannot be read (or passed, or too frequent for a person),
        :class:`~sessions.schedules.ScheduleLimitError` past a limit."""
        text = " ".join(instruction.split())
        if not text:
            raise triggers.TriggerError("say what to do when it fires (the instruction)")
        if len(text) > MAX_INSTRUCTION_CHARS:
            raise triggers.TriggerError(f"the instruction is longer than "
                                        f"{MAX_INSTRUCTION_CHARS} characters")
        tz = triggers.zone(zone)
        now = self.clock.now()
        kind, spec, start = _trigger(when, every, cron, tz, now)
        record = ScheduleRecord(
            id=schedule_id or new_schedule_id(), tenant=tenant, owner=owner, target=target,
            trigger=kind, spec=spec, zone=tz.key, instruction=text, created_by=created_by,
            created_at=now, start=start)
        first = triggers.first(record, now)
        if first is None:
            raise triggers.TriggerError(f"{when!r} has passed already "
                                        f"(it is {triggers.local_words(now, tz)} in {tz.key})")
        gap = triggers.min_gap(record, now)
        if not operator and gap < self.settings.min_interval:
            raise triggers.TriggerError(
                f"that repeats every {triggers.words_span(gap)}; schedules set in chat "
                f"repeat at most every {triggers.words_span(self.settings.min_interval)}")
        record = dataclasses.replace(record, next_at=first)
        await self.store.add(record, per_owner=0 if operator else self.settings.per_owner,
                             per_tenant=self.settings.per_tenant)
        log.info("schedule %s set in tenant %s by %s (%s)", record.id, tenant, created_by,
                 kind)
        if self.wake is not None:
            self.wake()
        return record

    async def owned(self, tenant: str, owner: str) -> list[ScheduleRecord]:
        return await self.store.find(tenant, owner=owner)

    async def cancel(self, tenant: str, schedule_id: str,
                     owner: str | None) -> ScheduleRecord | None:
        cancelled = await self.store.cancel(tenant, schedule_id.strip(), owner=owner)
        if cancelled is not None:
            log.info("schedule %s cancelled in tenant %s", cancelled.id, tenant)
        return cancelled

    def words(self, record: ScheduleRecord) -> str:
        """``s1a2b3c4: once, on ... (Europe/Berlin), in 14 hours: call the bank``."""
        return (f"{record.id}: {triggers.describe(record, self.clock.now())}: "
                f"{record.instruction}")


def _trigger(when: str | None, every: str | None, cron: str | None, tz: ZoneInfo,
             now: float) -> tuple[TriggerKind, str, float | None]:
    if cron:
        if when or every:
            raise triggers.TriggerError("give a cron expression alone, without when or every")
        return "cron", triggers.cron(cron), None
    if every:
        start = triggers.when(when, tz, now) if when else now + triggers.span(every)
        return "every", repr(triggers.span(every)), start
    if when:
        return "at", repr(triggers.when(when, tz, now)), None
    raise triggers.TriggerError("say when: a time (when), an interval (every) or a cron "
                                "expression (cron)")
