"""Conversation leases in Redis: acquire, renew, expire, take over, and the queue hand-off."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from coordination.keys import Keys
from coordination.redis_coordinator import RedisCoordinator
from gateway.coordination import Claim, LeaseLostError, QueueItem
from tests.coordination.harness import coordinator, item
from tests.coordination.services import REDIS_URL

pytestmark = pytest.mark.services


async def queue(coord: RedisCoordinator, it: QueueItem) -> Claim | None:
    """Queue an item as the router does (enter, then keep)."""
    await coord.conversations.enter(it)
    return await coord.conversations.keep(it)


async def test_lease_is_renewed_while_held_and_released_with_the_queue(
    redis: aioredis.Redis, prefix: str
) -> None:
    """The lease outlives its ttl while renewed, serves the queue in order, ends with it."""
    async with coordinator(prefix) as a, coordinator(prefix) as b:
        claim = await queue(a, item("c", "one"))
        assert await queue(b, item("c", "two")) is None
        assert claim is not None
        assert claim.token == 1
        lease = Keys(prefix).lease(claim.key)
        served = []
        async with a.conversations.holding(claim):
            while (next_item := await a.conversations.next(claim)) is not None:
                served.append(next_item.inbound.text)
                await asyncio.sleep(1.3)  # longer than the ttl: only renewal keeps the lease
                assert await redis.get(lease) == a.worker
                await a.conversations.done(claim, next_item)
        assert served == ["one", "two"]
        assert await redis.exists(lease) == 0
        again = await queue(b, item("c", "three"))
        assert again == Claim(claim.key, 2)


async def test_expired_lease_is_taken_over_with_the_started_item_resumed(
    redis: aioredis.Redis, prefix: str
) -> None:
    """A dead holder's lease lapses; a sweep adopts it with a higher token, head item resumed."""
    dead = RedisCoordinator(REDIS_URL, prefix=prefix, lease_ttl=1.0)
    await dead.__aenter__()
    claim = await queue(dead, item("c", "one"))
    assert claim is not None
    await queue(dead, item("c", "two"))
    started = await dead.conversations.next(claim)
    assert started is not None
    await dead.aclose()  # no release: the process "died" mid-turn
    async with coordinator(prefix) as heir:
        assert await heir.conversations.sweep() == []  # the lease has not lapsed yet
        await asyncio.sleep(1.1)
        [adopted] = await heir.conversations.sweep()
        assert adopted == Claim(claim.key, 2)
        got = []
        async with heir.conversations.holding(adopted):
            while (next_item := await heir.conversations.next(adopted)) is not None:
                got.append((next_item.id, next_item.inbound.text, next_item.resumed))
                await heir.conversations.done(adopted, next_item)
        assert got[0] == (started.id, "one", True)
        assert [(text, resumed) for _, text, resumed in got[1:]] == [("two", False)]
        assert await redis.smembers(Keys(prefix).active) == set()


async def test_holder_that_loses_its_lease_is_stopped(
    redis: aioredis.Redis, prefix: str
) -> None:
    """A holder whose lease another worker owns is stopped at its next renewal."""
    async with coordinator(prefix, ttl=3.0) as a:
        claim = await queue(a, item("c", "one"))
        assert claim is not None
        lease = Keys(prefix).lease(claim.key)

        async def serve() -> None:
            async with a.conversations.holding(claim):
                await a.conversations.next(claim)
                await redis.set(lease, "another-worker", px=10_000)
                await asyncio.sleep(10)

        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(LeaseLostError):
            await serve()
        assert loop.time() - started < 2.0  # renewal runs every ttl/3 = 1 s
        with pytest.raises(LeaseLostError):
            await a.conversations.next(claim)


async def test_queue_hand_off_strands_nothing_under_concurrency(prefix: str) -> None:
    """Submits racing the holder's release strand nothing: all served once, in order."""
    served: list[str] = []

    async def serve(coord: RedisCoordinator, claim: Claim) -> None:
        async with coord.conversations.holding(claim):
            while (next_item := await coord.conversations.next(claim)) is not None:
                served.append(next_item.inbound.text)
                await asyncio.sleep(0)
                await coord.conversations.done(claim, next_item)

    async with coordinator(prefix) as a, coordinator(prefix) as b, asyncio.TaskGroup() as tg:
        sent = []
        for n in range(300):
            coord = (a, b)[n % 2]
            text = f"m{n}"
            sent.append(text)
            claim = await queue(coord, item("c", text))
            if claim is not None:
                tg.create_task(serve(coord, claim))
            if n % 7 == 0:
                await asyncio.sleep(0.001)
    assert served == sent
