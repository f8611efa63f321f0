"""The scheduler's per-tenant proactive rate limit (``GATEWAY_SCHEDULE_PER_MINUTE``): over it,
a delivery is deferred in order (never dropped, never doubled), and every hold is recorded on
the schedule and counted; another tenant is not held. Real file store and usage ledger, a
fake clock, a fake router entry point and a channel that may write first."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from coordination.memory_ledger import MemoryLedger
from gateway.edge.channel import Accepted
from gateway.edge.messages import Inbound
from gateway.edge.metrics import Metrics
from gateway.schedule.fire import Reach
from gateway.schedule.scheduler import Scheduler
from gateway.schedule.service import ScheduleSettings
from sessions.jsonl import JsonlSessionStore
from sessions.schedule_file import FileScheduleStore
from sessions.schedules import ScheduleRecord, Target
from tests.fakes.clock import FakeClock

NOW = 1_790_000_000.0
MINUTE = 60.0


class SpeaksFirst:
    """A running channel whose platform lets the bot write first (Slack's rule)."""

    name = "chat"
    starts_conversations = True

    async def direct_chat(self, person: str, tenant: str) -> str | None:
        return f"dm-{person}"

    async def start(self, deliver: Any) -> None: ...

    def reply_sink(self, inbound: Inbound) -> Any: ...

    def health(self) -> Mapping[str, Any]:
        return {}

    async def aclose(self) -> None: ...


def due(ident: str, tenant: str) -> ScheduleRecord:
    return ScheduleRecord(
        id=ident, tenant=tenant, owner="tenant", target=Target("chat", f"room-{ident}", "group"),
        trigger="at", spec=repr(NOW), zone="UTC", instruction=f"say {ident}",
        created_by="operator", created_at=NOW - 10, next_at=NOW)


def counted(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_over_the_per_minute_limit_deliveries_wait_their_turn_in_order(
        tmp_path: Path) -> None:
    """Limit 2 a minute, five of tenant T1 due at once and one of T2: T1's first two and
    T2's go now, the next two a minute later, the last two minutes later; each held one
    says why and until when, each hold is counted, and every occurrence is delivered once."""
    store = FileScheduleStore(tmp_path / "state")
    for record in [*(due(f"s{n}", "T1") for n in range(1, 6)), due("t1", "T2")]:
        await store.put(record)
    clock, metrics = FakeClock(NOW), Metrics()
    handed: list[tuple[float, str, str]] = []

    async def deliver(inbound: Inbound) -> Accepted:
        handed.append((clock.now(), inbound.key.tenant, inbound.text.split()[1]))
        return Accepted(session_id=None)

    scheduler = Scheduler(store, ScheduleSettings(proactive_per_minute=2), clock,
                          deliver=deliver, reach=Reach(lambda name: SpeaksFirst(),
                                                       JsonlSessionStore(tmp_path)),
                          ledger=MemoryLedger(), metrics=metrics)
    async with scheduler:
        await clock.idle_after(0)
        held = {r.id: r for r in await store.find("T1")}
        for _ in range(2):
            rounds = clock.rounds
            clock.advance(MINUTE)
            await clock.idle_after(rounds)
        rounds = clock.rounds
        clock.advance(10 * MINUTE)  # long after: a round, and nothing more is delivered
        await clock.idle_after(rounds)
    assert handed == [(NOW, "T1", "s1"), (NOW, "T1", "s2"), (NOW, "T2", "t1"),
                      (NOW + MINUTE, "T1", "s3"), (NOW + MINUTE, "T1", "s4"),
                      (NOW + 2 * MINUTE, "T1", "s5")]
    assert {i: (r.held_until, r.held, r.held_reason) for i, r in held.items()} == {
        "s3": (NOW + MINUTE, 1, "the tenant's proactive rate limit (2 per minute)"),
        "s4": (NOW + MINUTE, 1, "the tenant's proactive rate limit (2 per minute)"),
        "s5": (NOW + 2 * MINUTE, 1, "the tenant's proactive rate limit (2 per minute)")}
    done = {r.id: r for r in await store.find(None, active_only=False)}
    assert {i: (r.state, r.fired, r.held, r.held_until) for i, r in done.items()} == {
        "s1": ("done", 1, 0, None), "s2": ("done", 1, 0, None), "s3": ("done", 1, 1, None),
        "s4": ("done", 1, 1, None), "s5": ("done", 1, 1, None), "t1": ("done", 1, 0, None)}
    assert (scheduler.fired, scheduler.held) == (6, 3)
    assert counted(metrics, "gateway_schedule_held_total", reason="rate_limit") == 3
    assert counted(metrics, "gateway_schedule_occurrences_total", outcome="fired") == 6


async def test_without_a_limit_nothing_is_held(tmp_path: Path) -> None:
    """GATEWAY_SCHEDULE_PER_MINUTE=0 (the default): all five due deliveries go in one round."""
    store = FileScheduleStore(tmp_path / "state")
    for n in range(1, 6):
        await store.put(due(f"s{n}", "T1"))
    clock, metrics = FakeClock(NOW), Metrics()
    handed: list[str] = []

    async def deliver(inbound: Inbound) -> Accepted:
        handed.append(inbound.text.split()[1])
        return Accepted(session_id=None)

    async with Scheduler(store, ScheduleSettings(), clock, deliver=deliver,
                         reach=Reach(lambda name: SpeaksFirst(), JsonlSessionStore(tmp_path)),
                         ledger=MemoryLedger(), metrics=metrics):
        await clock.idle_after(0)
    assert handed == ["s1", "s2", "s3", "s4", "s5"]
    assert counted(metrics, "gateway_schedule_held_total", reason="rate_limit") == 0
