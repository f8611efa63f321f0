"""Both schedule stores keep the same contract (gateway.schedule.store.ScheduleStore): limits,
owners, erasure, zones, and the two firing steps; the file is private and atomic."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.schedule.store import ScheduleStore
from sessions.postgres.schedules import PostgresScheduleStore
from sessions.postgres.store import PostgresSessionStore
from sessions.schedule_file import SCHEDULES_FILE, FileScheduleStore
from sessions.schedules import Outcome, ScheduleLimitError, ScheduleRecord, Target
from tests.sessions.pg import PG_URL, fresh_schema

NOW = 1_790_000_000.0


def record(ident: str, *, owner: str = "person:telegram:1", tenant: str = "default",
           next_at: float | None = NOW, target: Target | None = None) -> ScheduleRecord:
    return ScheduleRecord(id=ident, tenant=tenant, owner=owner,
                          target=target or Target("telegram", "1", "private", None, "1"),
                          trigger="at", spec=repr(NOW), zone="UTC", instruction=f"do {ident}",
                          created_by=owner, created_at=NOW, next_at=next_at)


@pytest.fixture(params=["file", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ScheduleStore]:
    if request.param == "file":
        yield FileScheduleStore(tmp_path / "state")
        return
    async with fresh_schema() as schema, PostgresSessionStore(PG_URL, schema=schema) as pg:
        yield PostgresScheduleStore(pg)


async def test_limits_per_owner_and_tenant(store: ScheduleStore) -> None:
    """The owner's limit and the tenant's are checked with the count; another tenant's
    schedules do not count."""
    await store.add(record("a"), per_owner=2, per_tenant=3)
    await store.add(record("b"), per_owner=2, per_tenant=3)
    with pytest.raises(ScheduleLimitError, match="2 active schedules each"):
        await store.add(record("c"), per_owner=2, per_tenant=3)
    await store.add(record("c", owner="chat:telegram:-5"), per_owner=2, per_tenant=3)
    with pytest.raises(ScheduleLimitError, match="3 active schedules here"):
        await store.add(record("d", owner="chat:telegram:-6"), per_owner=2, per_tenant=3)
    await store.add(record("d", tenant="T2"), per_owner=2, per_tenant=3)
    assert [r.id for r in await store.find("default")] == ["a", "b", "c"]


async def test_cancel_only_in_the_owners_scope(store: ScheduleStore) -> None:
    """Another owner cannot cancel it; its owner can, once; a cancelled one is not listed."""
    await store.add(record("a"), per_owner=0, per_tenant=0)
    assert await store.cancel("default", "a", owner="person:telegram:2") is None
    cancelled = await store.cancel("default", "a", owner="person:telegram:1")
    assert cancelled is not None
    assert cancelled.state == "cancelled"
    assert await store.cancel("default", "a") is None
    assert await store.find("default") == []
    assert [r.state for r in await store.find("default", active_only=False)] == ["cancelled"]


async def test_erase_person_takes_theirs_and_their_dms_and_their_zone(
        store: ScheduleStore) -> None:
    """Their reminders and schedules addressed to their DM go; a group's stays."""
    await store.add(record("mine"), per_owner=0, per_tenant=0)
    await store.add(record("to-me", owner="tenant",
                           target=Target("telegram", "", "private", None, "1")),
                    per_owner=0, per_tenant=0)
    await store.add(record("group", owner="chat:telegram:-5",
                           target=Target("telegram", "-5", "group")), per_owner=0, per_tenant=0)
    await store.add(record("other", owner="person:telegram:2",
                           target=Target("telegram", "2", "private", None, "2")),
                    per_owner=0, per_tenant=0)
    await store.set_zone("default", "telegram:1", "Europe/Berlin")
    assert await store.erase_person("default", "telegram", "1") == ["mine", "to-me"]
    assert await store.erase_person("default", "telegram", "1") == []
    assert [r.id for r in await store.find(None)] == ["group", "other"]
    assert await store.zone("default", "telegram:1") is None


async def test_erase_person_takes_the_reminders_they_set_in_a_group(
        store: ScheduleStore) -> None:
    """A reminder the person set in a group goes with them (it would fire in their name, with
    their words, after the erasure); one another member set in that group stays."""
    group = Target("telegram", "-5", "group")
    await store.add(dataclasses.replace(record("theirs", owner="chat:telegram:-5", target=group),
                                        created_by="person:telegram:1"),
                    per_owner=0, per_tenant=0)
    await store.add(dataclasses.replace(record("members", owner="chat:telegram:-5", target=group),
                                        created_by="person:telegram:2"),
                    per_owner=0, per_tenant=0)
    assert await store.erase_person("default", "telegram", "1") == ["theirs"]
    assert [r.id for r in await store.find(None)] == ["members"]


async def test_claim_then_deliver(store: ScheduleStore) -> None:
    """Step 1 claims what is due (only that), step 2 hands it over and writes the outcome;
    a held delivery waits until its time."""
    await store.add(record("due"), per_owner=0, per_tenant=0)
    await store.add(record("later", next_at=NOW + 60), per_owner=0, per_tenant=0)
    assert await store.next_due() == NOW

    def plan(r: ScheduleRecord, now: float) -> ScheduleRecord:
        return dataclasses.replace(r, firing=r.next_at, next_at=None)

    assert await store.claim(NOW, plan, 10) == 1
    assert await store.claim(NOW, plan, 10) == 0  # claimed: not claimed again
    handed: list[str] = []

    async def hold(r: ScheduleRecord) -> ScheduleRecord:
        handed.append(r.id)
        return dataclasses.replace(r, held_until=NOW + 5)

    assert await store.deliver(NOW, hold, 10) == 1
    assert await store.deliver(NOW + 1, hold, 10) == 0  # held
    assert await store.next_due() == NOW + 5

    async def fired(r: ScheduleRecord) -> ScheduleRecord:
        handed.append(r.id)
        return dataclasses.replace(r, firing=None, held_until=None).with_outcome(
            Outcome(NOW, "fired", NOW + 5))

    assert await store.deliver(NOW + 5, fired, 10) == 1
    assert handed == ["due", "due"]
    done = await store.get("default", "due")
    assert done is not None
    assert (done.state, done.fired, done.firing) == ("done", 1, None)
    assert await store.next_due() == NOW + 60


async def test_file_is_private_and_read_by_another_process(tmp_path: Path) -> None:
    """0600 in a 0700 folder; a second store over the same folder (gateway schedule add)
    sees what the first wrote, and the first sees the second's change."""
    first = FileScheduleStore(tmp_path / "state")
    await first.add(record("a"), per_owner=0, per_tenant=0)
    path = tmp_path / "state" / SCHEDULES_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    second = FileScheduleStore(tmp_path / "state")
    assert [r.id for r in await second.find("default")] == ["a"]
    await second.add(record("b", next_at=NOW - 10), per_owner=0, per_tenant=0)
    assert await first.next_due() == NOW - 10
    assert not [n for n in os.listdir(path.parent) if n.endswith(".tmp")]


async def test_two_postgres_workers_never_claim_the_same_row() -> None:
    """Two stores (two workers' pools) claiming 200 due rows at once: each row once."""
    async with fresh_schema() as schema, \
            PostgresSessionStore(PG_URL, schema=schema) as one, \
            PostgresSessionStore(PG_URL, schema=schema) as two:
        stores = [PostgresScheduleStore(one), PostgresScheduleStore(two)]
        for n in range(200):
            await stores[0].add(record(f"s{n:03d}"), per_owner=0, per_tenant=0)
        claimed: list[str] = []

        def plan(r: ScheduleRecord, now: float) -> ScheduleRecord:
            claimed.append(r.id)
            return dataclasses.replace(r, firing=r.next_at, next_at=None)

        async def claim_all(s: ScheduleStore) -> None:
            while await s.claim(NOW, plan, 7):  # each claim is a query: nothing to wait on
                pass

        await asyncio.gather(claim_all(stores[0]), claim_all(stores[1]))
    assert sorted(claimed) == [f"s{n:03d}" for n in range(200)]
