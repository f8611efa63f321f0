"""The usage ledger's contract, on both backends (in-process, Redis): totals per scope and
day, the sliding message window, and the in-process ledger's seed from the logs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence

import pytest
import redis.asyncio as redis_async

from coordination.memory_ledger import MemoryLedger
from coordination.redis_ledger import RedisLedger
from gateway.edge.ledger import NOTHING, SeedEntry, Spent, UsageLedger
from tests.coordination.private_services import PrivateRedis
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


async def test_counts_added_meanwhile_share_one_write_of_one_command_per_key() -> None:
    """Fifty calls counted at once (one tenant, one chat, fifty people) are written as one
    script call per key, 52 commands sent, where each call's four commands a scope were 600;
    every total is right and each ``add`` returned only once its count was written."""
    server = PrivateRedis()  # of its own: INFO commandstats counts every client's commands
    server.create()
    try:
        ledger = RedisLedger(server.url, "gwtest:")
        client = redis_async.Redis.from_url(server.url)
        try:
            scopes = [["tenant:t", "chat:t:c", f"user:t:web:u{n}"] for n in range(50)]
            await asyncio.gather(*(ledger.add(s, DAY, 10, 0.5) for s in scopes))
            stats = await client.info("commandstats")
            assert stats["cmdstat_evalsha"]["calls"] == 52
            # (commandstats counts a script's own calls too: two increments in each, no more)
            assert stats["cmdstat_hincrby"]["calls"] == 2 * 52
            assert await ledger.spent("tenant:t", DAY) == Spent(50, 500, 25.0)
            assert await ledger.spent("chat:t:c", DAY) == Spent(50, 500, 25.0)
            assert await ledger.spent("user:t:web:u7", DAY) == Spent(1, 10, 0.5)
        finally:
            await ledger.aclose()
            await client.aclose()
    finally:
        server.destroy()


async def test_counts_waiting_when_the_ledger_closes_are_written() -> None:
    """``aclose`` writes what was counted before it, rather than drop it."""
    client = await redis_client()
    prefix = new_prefix()
    ledger = RedisLedger(REDIS_URL, prefix)
    try:
        adding = asyncio.create_task(ledger.add(["tenant:t"], DAY, 7, 0.0))
        await asyncio.sleep(0)  # counted, its write not yet done
        await ledger.aclose()
        await adding
        reader = RedisLedger(REDIS_URL, prefix)
        try:
            assert await reader.spent("tenant:t", DAY) == Spent(1, 7, 0.0)
        finally:
            await reader.aclose()
    finally:
        await delete_prefix(client, prefix)
        await client.aclose()


async def test_a_tenants_retention_shortens_how_long_its_totals_are_kept() -> None:
    """Totals of a tenant whose retention is one hour expire after it (not after the three
    days kept otherwise); another tenant's keep the three days."""
    client = await redis_client()
    prefix = new_prefix()
    ledger = RedisLedger(REDIS_URL, prefix, keep=lambda t: 3600.0 if t == "short" else 1e9)
    try:
        await ledger.add(["tenant:short", "user:short:web:ada"], DAY, 5, 0.0)
        await ledger.add(["tenant:long"], DAY, 5, 0.0)
        ttls = {key.removeprefix(f"{prefix}usage:{DAY}:"): await client.ttl(key)
                for key in [k async for k in client.scan_iter(match=f"{prefix}usage:*")]}
    finally:
        await ledger.aclose()
        await delete_prefix(client, prefix)
        await client.aclose()
    assert set(ttls) == {"tenant:short", "user:short:web:ada", "tenant:long"}
    assert 3500 < ttls["tenant:short"] <= 3600
    assert 3500 < ttls["user:short:web:ada"] <= 3600
    assert ttls["tenant:long"] > 2 * 86_400


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


async def test_a_cancelled_waiter_leaves_the_seeding_to_finish() -> None:
    """A caller waiting for the day's seed is cancelled (a turn cut short by a stop): the
    seeding goes on and the first caller gets its totals (the shared wait was cancelled with
    the waiter, and the seeder's wake-up raised InvalidStateError into its turn)."""
    release = asyncio.Event()

    async def seed(day: str) -> Iterable[SeedEntry]:
        await release.wait()
        return [(["tenant:t"], 1000, 1.5)]

    ledger = MemoryLedger(seed)
    seeder = asyncio.ensure_future(ledger.add(["tenant:t"], DAY, 10, 0.5))
    waiter = asyncio.ensure_future(ledger.spent("tenant:t", DAY))
    for _ in range(100):  # both run as far as they go on the loop: the seed is held
        await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.wait([waiter])
    release.set()
    await seeder
    assert waiter.cancelled()
    assert await ledger.spent("tenant:t", DAY) == Spent(2, 1010, 2.0)


async def test_a_cancelled_seeding_is_done_again_by_the_next_caller() -> None:
    """The caller seeding the day is cancelled: nothing is stored for the day (not empty
    totals, which would let a spent budget through); a caller already waiting, and the next
    one, seed it again and count what the logs hold."""
    asked: list[str] = []
    first = asyncio.Event()

    async def seed(day: str) -> Iterable[SeedEntry]:
        asked.append(day)
        if len(asked) == 1:
            await first.wait()  # held until cancelled
        return [(["tenant:t"], 1000, 1.5)]

    ledger = MemoryLedger(seed)
    seeder = asyncio.ensure_future(ledger.spent("tenant:t", DAY))
    waiter = asyncio.ensure_future(ledger.spent("tenant:t", DAY))
    await until(lambda: asked)
    for _ in range(100):
        await asyncio.sleep(0)
    seeder.cancel()
    assert await waiter == Spent(1, 1000, 1.5)
    assert seeder.cancelled()
    assert await ledger.spent("tenant:t", DAY) == Spent(1, 1000, 1.5)
    assert asked == [DAY, DAY]


async def test_a_failing_seed_counts_from_now(caplog: pytest.LogCaptureFixture) -> None:
    """A seed that raises is logged once; the ledger counts from then on."""

    async def seed(day: str) -> Sequence[SeedEntry]:
        raise OSError("disk gone")

    ledger = MemoryLedger(seed)
    await ledger.add(["tenant:t"], DAY, 7, 0.0)
    assert await ledger.spent("tenant:t", DAY) == Spent(1, 7, 0.0)
    assert "could not read today's usage from the logs (OSError)" in caplog.text
