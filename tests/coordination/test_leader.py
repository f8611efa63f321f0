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
from tests.coordination.harness import coordinator, lapse, renewal_seen, wait_until
from tests.coordination.services import REDIS_URL
from tests.waiting import WAIT

pytestmark = pytest.mark.services

TTL = 15.0
"""Seconds a leadership lasts unrenewed: renewals run every 5 s, and a busy machine's loop would
have to stall for 12 s to lose it. The tests never sleep through it: they move Redis's clock
on (:func:`tests.coordination.harness.renewal_seen`, :func:`~tests.coordination.harness.lapse`)."""

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
    """One of two electors leads and renews its leadership; when it shuts down the other takes
    over (it gave the key up at once, not left to lapse)."""
    log: list[tuple[str, str]] = []
    running: set[str] = set()
    key = Keys(prefix).leader("poll")
    async with coordinator(prefix, ttl=TTL) as a, coordinator(prefix, ttl=TTL) as b:
        electors = {"a": a.elector("poll"), "b": b.elector("poll")}
        tasks = {name: asyncio.create_task(e.lead(recording_job(name, log, running)))
                 for name, e in electors.items()}
        try:
            await wait_until(lambda: bool(running))
            [first] = running
            workers = {"a": a.worker, "b": b.worker}
            # Its end brought near, then pushed back by its renewal: it keeps leading.
            assert await renewal_seen(redis, key, TTL) == workers[first]
            assert log == [(first, "start")]
            second = "b" if first == "a" else "a"
            await stop(tasks[first])
            # Given up at once (not left to lapse): free, or already the other's.
            holder = await redis.get(key)
            assert holder in (None, workers[second])
            await wait_until(lambda: running == {second})
            assert [(e.is_leader, e.terms) for e in (electors[first], electors[second])] == [
                (False, 1), (True, 1)]
        finally:
            for task in tasks.values():
                await stop(task)
    assert log == [(first, "start"), (first, "stop"), (second, "start"), (second, "stop")]


async def test_failover_after_the_leader_process_is_killed(
    prefix: str, redis: aioredis.Redis
) -> None:
    """After SIGKILL of the leader the other elector leads only once the dead one's key lapses
    (which the test brings about: Redis's clock is moved on, not slept through)."""
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
        assert await asyncio.wait_for(proc.stdout.readline(), WAIT) == b"leading\n"
        log: list[tuple[str, str]] = []
        running: set[str] = set()
        async with coordinator(prefix, ttl=TTL) as b:
            elector = b.elector("poll")
            assert isinstance(elector, RedisLeaderElector)
            task = asyncio.create_task(elector.lead(recording_job("b", log, running)))
            key = Keys(prefix).leader("poll")
            try:
                # The live leader renews (its end brought near, then pushed back) while b
                # campaigns: b does not lead.
                assert await renewal_seen(redis, key, TTL) != b.worker
                assert log == []
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                await lapse(redis, key)  # the dead leader's key runs out (it was still there)
                await wait_until(lambda: bool(running))
                holder = await redis.get(key)
            finally:
                await stop(task)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    assert holder == b.worker
    assert log == [("b", "start"), ("b", "stop")]
