"""The usage ledger's contract, on both backends (in-process, Redis): totals per scope and
day, the sliding message window, and the in-process ledger's seed from the logs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence

import pytest

from coordination.memory_ledger import MemoryLedger
from coordination.redis_ledger import RedisLedger
from gateway.edge.ledger import NOTHING, SeedEntry, Spent, UsageLedger
from tests.coordination.services import REDIS_URL, delete_prefix, new_prefix, redis_client
from tests.waiting import until

DAY = "2026-12-01"


@pytest.fixture(params=["memory", "redis"])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[UsageLedger]:
    """Each backend; Redis under a fresh prefix, deleted after (skipped when not there)."""
    if request.param == "memory":
        yield MemoryLedger()
        return
    client = await redis_client()
    prefix = new_prefix()
    backend = RedisLedger(REDIS_URL, prefix)
    try:
        yield backend
    finally:
        await backend.aclose()
        await delete_prefix(client, prefix)
        await client.aclose()


async def test_totals_add_up_per_scope_and_day(ledger: UsageLedger) -> None:
    """Each scope of a call counts it; other scopes and other days see nothing."""
    await ledger.add(["tenant:t", "user:t:web:ada"], DAY, 100, 0.25)
    await ledger.add(["tenant:t", "user:t:web:bob"], DAY, 50, 0.5)
    assert await ledger.spent("tenant:t", DAY) == Spent(2, 150, 0.75)
    assert await ledger.spent("user:t:web:ada", DAY) == Spent(1, 100, 0.25)
    assert await ledger.spent("user:t:web:ada", "2026-12-02") == NOTHING
    assert await ledger.spent("tenant:other", DAY) == NOTHING


async def test_message_window_slides(ledger: UsageLedger) -> None:
    """Three messages in 60 s pass; the fourth waits until the first leaves the window."""
    scope = "user:t:web:ada"
    assert [await ledger.hit(scope, t, 3, 60.0) for t in (0.0, 10.0, 20.0)] == [0, 0, 0]
    assert await ledger.hit(scope, 30.0, 3, 60.0) == pytest.approx(30.0)
    assert await ledger.hit(scope, 59.0, 3, 60.0) == pytest.approx(1.0)
    assert await ledger.hit(scope, 60.5, 3, 60.0) == 0  # the first left the window
    assert await ledger.hit("user:t:web:bob", 30.0, 3, 60.0) == 0  # people apart


async def test_redis_outage_lets_people_through() -> None:
    """Nothing listening: counts are dropped, totals read as nothing, messages pass."""
    ledger = RedisLedger("redis://127.0.0.1:1/0", "gwtest:down:")
    try:
        await ledger.add(["tenant:t"], DAY, 5, 0.1)
        assert await ledger.spent("tenant:t", DAY) == NOTHING
        assert await ledger.hit("user:t:web:ada", 0.0, 1, 60.0) == 0
    finally:
        await ledger.aclose()


async def test_memory_ledger_seeds_each_day_once() -> None:
    """The seed runs once per day, concurrent first users wait for it, and its calls count."""
    asked: list[str] = []
    release = asyncio.Event()

    async def seed(day: str) -> Iterable[SeedEntry]:
        asked.append(day)
        await release.wait()  # still seeding while the second user asks
        return [(["tenant:t", "user:t:web:ada"], 1000, 1.5)]

    ledger = MemoryLedger(seed)
    both = asyncio.gather(ledger.spent("tenant:t", DAY), ledger.spent("user:t:web:ada", DAY))
    await until(lambda: asked)
    for _ in range(100):  # the second user's call runs as far as it goes on the loop
        await asyncio.sleep(0)
    release.set()
    first, second = await both
    await ledger.add(["tenant:t"], DAY, 10, 0.5)
    assert (first, second) == (Spent(1, 1000, 1.5), Spent(1, 1000, 1.5))
    assert await ledger.spent("tenant:t", DAY) == Spent(2, 1010, 2.0)
    await ledger.spent("tenant:t", "2026-12-02")
    assert asked == [DAY, "2026-12-02"]


async def test_a_failing_seed_counts_from_now(caplog: pytest.LogCaptureFixture) -> None:
    """A seed that raises is logged once; the ledger counts from then on."""

    async def seed(day: str) -> Sequence[SeedEntry]:
        raise OSError("disk gone")

    ledger = MemoryLedger(seed)
    await ledger.add(["tenant:t"], DAY, 7, 0.0)
    assert await ledger.spent("tenant:t", DAY) == Spent(1, 7, 0.0)
    assert "could not read today's usage from the logs (OSError)" in caplog.text
