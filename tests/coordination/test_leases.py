"""Conversation leases in Redis over the owed messages in PostgreSQL: acquire, renew, expire,
take over, the queue hand-off, fencing tokens that never go back, and the lease guard."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from coordination.keys import Keys
from coordination.lease_guard import LeaseGuard, guarded
from coordination.redis_coordinator import RedisCoordinator
from gateway.edge.coordination import Claim, LeaseLostError, QueueItem
from sessions.postgres.store import PostgresSessionStore
from tests.coordination.harness import coordinator, inbox_of, item, lapse, renewal_seen
from tests.coordination.services import REDIS_URL

pytestmark = pytest.mark.services


async def forever() -> None:
    """A call that never returns: only a cancellation ends it."""
    await asyncio.get_running_loop().create_future()


async def queue(coord: RedisCoordinator, it: QueueItem) -> Claim | None:
    """Receive an item as the router does (enter, then keep)."""
    assert not (await coord.conversations.enter(it)).duplicate
    return await coord.conversations.keep(it)


async def serve_all(coord: RedisCoordinator, claim: Claim, served: list[str]) -> None:
    async with coord.conversations.holding(claim):
        while (next_item := await coord.conversations.next(claim)) is not None:
            served.append(next_item.inbound.text)
            await coord.conversations.done(claim, next_item)


async def test_lease_is_renewed_while_held_and_released_with_the_queue(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore
) -> None:
    """The lease is renewed while held (each time the end of its ttl comes near, the holder
    pushes it back), serves the queue in order, ends with it; the next claim gets a newer token.

    Redis's clock is moved on instead of slept through (:func:`renewal_seen`), and the ttl is
    15 s: a renewal every 5 s, while a loaded machine's stalled loop would need 12 s to lose
    it. What is tested is that renewal keeps the lease, not how short a ttl survives."""
    ttl = 15.0
    async with coordinator(prefix, pg_store, ttl=ttl) as a, \
            coordinator(prefix, pg_store, ttl=ttl) as b:
        claim = await queue(a, item("c", "one"))
        assert await queue(b, item("c", "two")) is None
        assert claim is not None
        lease = Keys(prefix).lease(claim.key)
        served: list[str] = []
        renewed: list[str | None] = []
        async with a.conversations.holding(claim):
            while (next_item := await a.conversations.next(claim)) is not None:
                served.append(next_item.inbound.text)
                renewed.append(await renewal_seen(redis, lease, ttl))
                await a.conversations.done(claim, next_item)
        assert served == ["one", "two"]
        assert [owner.split("/")[0] if owner else None for owner in renewed] == [
            a.worker, a.worker]
        assert await redis.exists(lease) == 0
        again = await queue(b, item("c", "three"))
        assert again is not None
        await serve_all(b, again, served)
    assert claim.token is not None
    assert again.token is not None
    assert again.token > claim.token


async def test_a_holder_that_wound_up_late_releases_only_its_own_lease(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore
) -> None:
    """Redis lost a holder's lease (FLUSHDB) and the same worker claimed the conversation again
    before the old holder's release: that release leaves the new claim's lease alone (the old
    code deleted whatever lease carried the worker's id, so another worker could take the
    conversation while this one served it), and the new claim's own release deletes it."""
    async with coordinator(prefix, pg_store, ttl=60) as a:  # no renewal during the test
        old = await queue(a, item("c", "one"))
        assert old is not None
        lease = Keys(prefix).lease(old.key)
        async with a.conversations.holding(old):
            assert await a.conversations.next(old) is not None
            await redis.delete(lease)  # this test's FLUSHDB: only the lease
        new = await queue(a, item("c", "two"))
        assert new is not None  # the same worker claims it again: a new holder
        await a.conversations.release(old)  # the old holder winds up after that
        after_old = await redis.get(lease)
        await a.conversations.release(new)
        after_new = await redis.get(lease)
    assert after_old is not None
    assert after_old.split("/")[0] == a.worker
    assert after_new is None


async def test_expired_lease_is_taken_over_with_the_started_item_resumed(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore
) -> None:
    """A dead holder's lease lapses; a sweep adopts it, the head item it took resumed."""
    dead = RedisCoordinator(REDIS_URL, inbox_of(pg_store), prefix=prefix, lease_ttl=60.0)
    await dead.__aenter__()
    claim = await queue(dead, item("c", "one"))
    assert claim is not None
    await queue(dead, item("c", "two"))
    started = await dead.conversations.next(claim)
    assert started is not None
    await dead.aclose()  # no release: the process "died" mid-turn
    async with coordinator(prefix, pg_store) as heir:
        assert await heir.conversations.sweep() == []  # the lease has not lapsed yet
        await lapse(redis, Keys(prefix).lease(claim.key))
        [adopted] = await heir.conversations.sweep()
        assert adopted == Claim(claim.key)
        got = []
        async with heir.conversations.holding(adopted):
            while (next_item := await heir.conversations.next(adopted)) is not None:
                got.append((next_item.id, next_item.inbound.text, next_item.resumed))
                await heir.conversations.done(adopted, next_item)
        assert got[0] == (started.id, "one", True)
        assert [(text, resumed) for _, text, resumed in got[1:]] == [("two", False)]
        assert await heir.conversations.sweep() == []  # nothing owed any more


async def test_holder_that_loses_its_lease_is_stopped(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore
) -> None:
    """A holder whose lease another worker owns is stopped at its next renewal (which says it
    was taken over; a lapsed lease would say so instead: no clock is read)."""
    async with coordinator(prefix, pg_store, ttl=15.0) as a:  # renewal every 5 s, lapse at 12
        claim = await queue(a, item("c", "one"))
        assert claim is not None
        lease = Keys(prefix).lease(claim.key)

        async def serve() -> None:
            async with a.conversations.holding(claim):
                await a.conversations.next(claim)
                await redis.set(lease, "another-worker", px=60_000)
                await forever()

        with pytest.raises(LeaseLostError, match="was taken over"):
            await serve()


async def test_redis_losing_everything_loses_nothing_and_tokens_go_on(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore
) -> None:
    """Every Redis key gone mid-serve (FLUSHDB): the holder is stopped, the sweep hands the
    owed items over again, and the new token is newer than the old one (it is PostgreSQL's)."""
    async with coordinator(prefix, pg_store) as a, coordinator(prefix, pg_store) as b:
        claim = await queue(a, item("c", "one"))
        await queue(a, item("c", "two"))
        assert claim is not None

        async def serve() -> None:
            async with a.conversations.holding(claim):
                await a.conversations.next(claim)
                keys = [k async for k in redis.scan_iter(match=f"{prefix}*")]
                await redis.delete(*keys)  # this test's FLUSHDB: only its own prefix
                await forever()

        with pytest.raises(LeaseLostError):
            await serve()
        [adopted] = await b.conversations.sweep()
        served: list[str] = []
        await serve_all(b, adopted, served)
    assert served == ["one", "two"]
    assert claim.token is not None
    assert adopted.token is not None
    assert adopted.token > claim.token


async def test_a_worker_never_claims_a_conversation_it_serves_twice(
    redis: aioredis.Redis, prefix: str, pg_store: PostgresSessionStore
) -> None:
    """Redis lost the lease (FLUSHDB) while a worker serves the conversation: a message that
    worker receives then gets no second claim (two holders in one process would share one
    cached session, which the fence cannot tell apart); its holder serves it."""
    async with coordinator(prefix, pg_store, ttl=6.0) as a:  # renewal every 2 s: not in time
        claim = await queue(a, item("c", "one"))
        assert claim is not None
        served: list[str] = []
        async with a.conversations.holding(claim):
            first = await a.conversations.next(claim)
            assert first is not None
            keys = [k async for k in redis.scan_iter(match=f"{prefix}*")]
            await redis.delete(*keys)  # this test's FLUSHDB: only its own prefix
            assert await queue(a, item("c", "two")) is None
            served.append(first.inbound.text)
            await a.conversations.done(claim, first)
            while (next_item := await a.conversations.next(claim)) is not None:
                served.append(next_item.inbound.text)
                await a.conversations.done(claim, next_item)
    assert served == ["one", "two"]


async def test_queue_hand_off_strands_nothing_under_concurrency(
    prefix: str, pg_store: PostgresSessionStore
) -> None:
    """Receives racing the holder's release strand nothing: all served once, in order."""
    served: list[str] = []
    async with coordinator(prefix, pg_store) as a, coordinator(prefix, pg_store) as b, \
            asyncio.TaskGroup() as tg:
        sent = []
        for n in range(120):
            coord = (a, b)[n % 2]
            text = f"m{n}"
            sent.append(text)
            claim = await queue(coord, item("c", text))
            if claim is not None:
                tg.create_task(serve_all(coord, claim, served))
            if n % 7 == 0:
                await asyncio.sleep(0.001)
    assert served == sent


async def test_the_guard_stops_a_task_that_swallows_a_cancellation() -> None:
    """A cancellation lost inside a library call (Python 3.11's wait_for) does not save the
    task: the guard cancels again until it stops, and says the lease was lost."""
    swallowed = []

    async def swallowing_call() -> None:
        try:
            await forever()
        except asyncio.CancelledError:
            swallowed.append(True)  # as wait_for does when its inner call just completed
        await forever()

    async def serve() -> None:
        task = asyncio.current_task()
        assert task is not None
        guard = LeaseGuard(task, asyncio.get_running_loop().time() + 0.05, "c")
        async with guarded(guard):
            await swallowing_call()

    outer = asyncio.current_task()
    assert outer is not None
    before = outer.cancelling()
    with pytest.raises(LeaseLostError):
        await asyncio.wait_for(serve(), 5)
    assert swallowed == [True]
    assert outer.cancelling() == before


async def test_the_guard_leaves_an_outside_cancellation_alone() -> None:
    """A shutdown's cancel of a guarded task stays a cancellation, lease or not."""
    started = asyncio.Event()

    async def serve() -> None:
        task = asyncio.current_task()
        assert task is not None
        guard = LeaseGuard(task, asyncio.get_running_loop().time() + 60, "c")
        async with guarded(guard):
            started.set()
            await forever()

    task = asyncio.create_task(serve())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_deadline_that_passed_is_caught_before_the_timer_runs() -> None:
    """A worker resumed past its deadline (SIGSTOP/SIGCONT) fails the check at once, and
    renewing a lapsed guard changes nothing (it never raises either)."""
    task = asyncio.current_task()
    assert task is not None
    guard = LeaseGuard(task, asyncio.get_running_loop().time() - 1.0, "c")
    with pytest.raises(LeaseLostError, match="lapsed"):
        guard.check()
    guard.extend(asyncio.get_running_loop().time() + 60)  # too late: stays lost
    with pytest.raises(LeaseLostError):
        guard.check()
    assert guard.settle(None) is None
