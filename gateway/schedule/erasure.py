"""The eraser's step for schedules: a person's reminders (those they set in a group too: they
would fire in the person's name), the schedules that speak in their one-to-one chat, and
their time zone (:func:`sessions.schedules.belongs_to`). A group's other schedules are the
group's and stay, as its log does."""

from __future__ import annotations

from gateway.erasure.eraser import ErasurePlan, Removal
from gateway.schedule.store import ScheduleStore
from sessions.schedules import belongs_to


class ScheduleStep:
    """:class:`gateway.erasure.eraser.ErasureStep` over the schedule store."""

    def __init__(self, store: ScheduleStore) -> None:
        self.store = store

    async def find(self, plan: ErasurePlan) -> list[Removal]:
        scope = plan.scope
        found = await self.store.find(scope.tenant, active_only=False)
        return [Removal("schedule", r.id) for r in found
                if belongs_to(r, scope.channel, scope.id)]

    async def remove(self, plan: ErasurePlan, found: list[Removal],
                     requested_by: str) -> list[Removal]:
        scope = plan.scope
        removed = await self.store.erase_person(scope.tenant, scope.channel, scope.id)
        return [Removal("schedule", schedule_id) for schedule_id in removed]
