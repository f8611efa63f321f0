"""Leader election for singleton jobs (a bot's long poll): one leader, hand-over, failover."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from coordination.keys import Keys
from coordination.leader import RedisLeaderElector
from gateway.edge.tasks import stop
from tests.coordination.harness import coordinator, wait_until
from tests.coordination.services import REDIS_URL

pytestmark = pytest.mark.services

TTL = 3.0
"""Seconds a leadership lasts unrenewed: long enough that a busy machine's stalled loop does
not lose it (renewals run every ttl/3)."""

ROOT = Path(__file__).resolve().parents[2]


def recording_job(name: str, log: list[tuple[str, str]],
                  running: set[str]) -> Callable[[], Awaitable[None]]:
    """A job that records when it starts and stops, and checks nobody else runs meanwhile."""

    async def job() -> None:
        assert not running, f"{name} started while {running} was running"
        running.add(name)
        log.append((name, "start"))
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            running.discard(name)
            log.append((name, "stop"))

    return job


async def test_one_leader_and_hand_over_when_it_shuts_down(prefix: str,
                                                           redis: aioredis.Redis) -> None:
    """One of two electors leads past the ttl; when it shuts down the other takes over at once."""
    log: list[tuple[str, str]] = []
    running: set[str] = set()
    # A 3 s ttl, not 1 s: a loaded CI machine can stall a loop for over a second, and then
    # leadership really lapses; what is tested is that renewal keeps it past the ttl.
    async with coordinator(prefix, ttl=TTL) as a, coordinator(prefix, ttl=TTL) as b:
        electors = {"a": a.elector("poll"), "b": b.elector("poll")}
        tasks = {name: asyncio.create_task(e.lead(recording_job(name, log, running)))
                 for name, e in electors.items()}
        try:
            await wait_until(lambda: bool(running), 5)
            [first] = running
            await asyncio.sleep(TTL + 1.0)  # past the ttl: renewals keep it
            assert log == [(first, "start")]
            second = "b" if first == "a" else "a"
            await stop(tasks[first])
            # Given up at once (not left to lapse): free, or already the other's.
            holder = await redis.get(Keys(prefix).leader("poll"))
            assert holder in (None, b.worker if second == "b" else a.worker)
            await wait_until(lambda: running == {second}, 5)
            assert [(e.is_leader, e.terms) for e in (electors[first], electors[second])] == [
                (False, 1), (True, 1)]
        finally:
            for task in tasks.values():
                await stop(task)
    assert log == [(first, "start"), (first, "stop"), (second, "start"), (second, "stop")]


async def test_failover_after_the_leader_process_is_killed(
    prefix: str, redis: aioredis.Redis
) -> None:
    """After SIGKILL of the leader the other elector leads only once the dead one's key lapses."""
    script = textwrap.dedent(f"""
        import asyncio
        from coordination.redis_coordinator import RedisCoordinator
        from tests.coordination.harness import NoInbox

        async def main():
            async with RedisCoordinator({REDIS_URL!r}, NoInbox(), prefix={prefix!r},
                                        lease_ttl={TTL}) as c:
                async def job():
                    print("leading", flush=True)
                    await asyncio.Event().wait()
                await c.elector("poll").lead(job)

        asyncio.run(main())
    """)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 15) == b"leading\n"
        log: list[tuple[str, str]] = []
        running: set[str] = set()
        async with coordinator(prefix, ttl=TTL) as b:
            elector = b.elector("poll")
            assert isinstance(elector, RedisLeaderElector)
            task = asyncio.create_task(elector.lead(recording_job("b", log, running)))
            try:
                await asyncio.sleep(TTL + 1.0)
                assert log == []  # the live leader keeps renewing past its ttl
                key = Keys(prefix).leader("poll")
                proc.send_signal(signal.SIGKILL)
                remaining = await redis.pttl(key) / 1000
                loop = asyncio.get_running_loop()
                killed = loop.time()
                await wait_until(lambda: bool(running), 10)
                waited = loop.time() - killed
            finally:
                await stop(task)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    assert remaining > 0
    assert waited >= remaining - 0.05  # not before the dead leader's key lapsed
    assert waited < remaining + 5.0  # campaigns run every ttl/3 or so (slack for a busy box)
    assert log == [("b", "start"), ("b", "stop")]
