"""Retention with several workers: the elected worker alone runs the passes on the shared
PostgreSQL store, and another takes them over when it stops."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

import pytest
import redis.asyncio as aioredis

from coordination.keys import Keys
from gateway.edge.metrics import Metrics
from gateway.schedule.retention import EVERY, Retention
from sessions.postgres.blobs import PostgresBlobStore
from sessions.postgres.store import PostgresSessionStore
from sessions.retention import DAY, RetentionPolicy
from tests.coordination.harness import coordinator, wait_until
from tests.fakes.clock import FakeClock
from tests.sessions.helpers import add, user

pytestmark = pytest.mark.services

TTL = 3.0
"""Seconds a leadership lasts unrenewed; the follower campaigns again every third of it."""


def removed(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value(
        "gateway_retention_removed_total", {"kind": "sessions"}) or 0.0


async def aged(store: PostgresSessionStore, name: str, days_ago: float) -> str:
    writer = await store.create(channel="web", conversation=f"web:{name}")
    await add(writer, user(f"hello from {name}"))
    await writer.aclose()
    async with store.connection() as conn:
        await conn.execute(f"UPDATE {store.quoted_schema}.sessions SET modified_at ="
                           " to_timestamp($2) WHERE id = $1", writer.session_id,
                           time.time() - days_ago * DAY)
    return writer.session_id


async def test_one_elected_worker_prunes_and_another_takes_over_when_it_stops(
        prefix: str, redis: aioredis.Redis, pg_store: PostgresSessionStore) -> None:
    """Two workers with seven days' retention: the leader's passes remove the 20-day-old
    session (once) and the follower runs none while it leads, through two more of its passes;
    once the leader stops, the follower is elected and its passes run (removing what aged
    meanwhile)."""
    await aged(pg_store, "old", 20)
    await aged(pg_store, "recent", 1)
    blobs = PostgresBlobStore(pg_store)
    clocks = {"a": FakeClock(start=time.time()), "b": FakeClock(start=time.time())}
    metrics = {"a": Metrics(), "b": Metrics()}
    async with coordinator(prefix, ttl=TTL) as a, coordinator(prefix, ttl=TTL) as b:
        owners = {"a": a.worker, "b": b.worker}
        stacks = {"a": AsyncExitStack(), "b": AsyncExitStack()}
        try:
            for name, coord in (("a", a), ("b", b)):
                await stacks[name].enter_async_context(Retention(
                    RetentionPolicy(7), pg_store, blobs, clocks[name],
                    elector=coord.elector("retention"), metrics=metrics[name]))
            await wait_until(lambda: clocks["a"].rounds + clocks["b"].rounds >= 1)
            leader = "a" if clocks["a"].rounds else "b"
            follower = "b" if leader == "a" else "a"
            for rounds in (1, 2):  # two more of the leader's passes: the follower had time
                clocks[leader].advance(EVERY + 1)
                await clocks[leader].idle_after(rounds)
            assert await redis.get(Keys(prefix).leader("retention")) == owners[leader]
            assert clocks[follower].rounds == 0
            assert [i.conversation for i in await pg_store.list_sessions()] == ["web:recent"]
            assert (removed(metrics[leader]), removed(metrics[follower])) == (1.0, 0.0)
            await aged(pg_store, "aged-meanwhile", 30)
            await stacks[leader].aclose()  # the leader stops: it gives the key up at once
            await wait_until(lambda: clocks[follower].rounds >= 1)
            assert (removed(metrics[leader]), removed(metrics[follower])) == (1.0, 1.0)
            assert [i.conversation for i in await pg_store.list_sessions()] == ["web:recent"]
        finally:
            for stack in stacks.values():
                await stack.aclose()
