"""The eraser's step for schedules: a person's reminders, the schedules that speak in their
one-to-one chat, and their time zone (:func:`sessions.schedules.belongs_to`). A group's
schedules are the group's and stay, as its log does."""

from __future__ import annotations

from gateway.edge.scopes import Scope
from gateway.erasure.eraser import ErasureStep, Removal
from gateway.schedule.store import ScheduleStore


def schedule_step(store: ScheduleStore) -> ErasureStep:
    async def step(scope: Scope, requested_by: str) -> list[Removal]:
        removed = await store.erase_person(scope.tenant, scope.channel, scope.id)
        return [Removal("schedule", schedule_id) for schedule_id in removed]

    return step
