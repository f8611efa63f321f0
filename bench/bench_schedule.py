"""What the scheduler costs: CPU per idle minute with 10,000 schedules, and firing lag at 100
due per second, for the file store and the PostgreSQL store, against floors measured in the
same run.

* **Idle**: 10,000 active schedules all due tomorrow; the real scheduler (system clock,
  ``GATEWAY_SCHEDULE_POLL`` = 1 s) runs for ``--idle`` seconds; the process's CPU time over
  that window, scaled to a minute. Floor: an event loop waking once a second for the same
  window (what any poller pays). PostgreSQL's own CPU (its server process) is not counted.
* **Lag**: ``--due`` schedules whose times are spread at 100 per second, starting 2 s after
  the scheduler starts (10,000 idle ones beside them); each delivery records how long after
  its occurrence the router's ``deliver`` was handed the scheduled inbound (a fake at that
  seam: what comes after, recording and answering, is any message's cost). p50/p99 in ms.
  Floor: ``loop.call_at`` callbacks at the same times (the event loop's own lateness).

Run: .venv/bin/python bench/bench_schedule.py [--idle 30] [--due 3000] [--pg URL]
Report: bench/out/schedule.md
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.edge.channel import Accepted  # noqa: E402
from gateway.edge.messages import Inbound  # noqa: E402
from gateway.schedule.clock import SystemClock  # noqa: E402
from gateway.schedule.fire import Reach  # noqa: E402
from gateway.schedule.scheduler import Scheduler  # noqa: E402
from gateway.schedule.service import ScheduleSettings  # noqa: E402
from gateway.schedule.store import ScheduleStore  # noqa: E402
from sessions.schedule_file import FileScheduleStore  # noqa: E402
from sessions.schedules import ScheduleRecord, Target  # noqa: E402

OUT = ROOT / "bench" / "out"
IDLE = 10_000
RATE = 100.0


class Channel:
    """A channel that may write first (no session lookup): the seam's cheapest case."""

    name = "bench"
    starts_conversations = True

    async def direct_chat(self, person: str, tenant: str) -> str | None:
        return person

    async def start(self, deliver: Any) -> None: ...

    def reply_sink(self, inbound: Inbound) -> Any: ...

    def health(self) -> Mapping[str, Any]:
        return {}

    async def aclose(self) -> None: ...


def record(n: int, at: float) -> ScheduleRecord:
    chat = f"c{n % 500}"
    return ScheduleRecord(id=f"b{n:06d}", tenant="default", owner=f"person:bench:{chat}",
                          target=Target("bench", chat, "private", None, chat), trigger="at",
                          spec=repr(at), zone="UTC", instruction=f"bench {n}",
                          created_by="operator", created_at=at - 10, next_at=at)


async def fill(store: ScheduleStore, records: list[ScheduleRecord]) -> None:
    if isinstance(store, FileScheduleStore):  # one write, not 10,000
        def work() -> None:
            for r in records:
                store._set(r)
        await store._change(work)
        return
    for first in range(0, len(records), 100):  # 100 at a time, side by side
        await asyncio.gather(*(store.put(r) for r in records[first:first + 100]))


def scheduler(store: ScheduleStore, lags: list[float]) -> Scheduler:
    async def deliver(inbound: Inbound) -> Accepted:
        occurrence = float(inbound.platform_id.rsplit(":", 1)[1]) / 1000 \
            if inbound.platform_id else 0.0
        lags.append(time.time() - occurrence)
        return Accepted(session_id=None)

    return Scheduler(store, ScheduleSettings(poll=1.0, batch=200), SystemClock(),
                     deliver=deliver, reach=Reach(lambda name: Channel(), None))  # type: ignore[arg-type]


async def idle_cpu(store: ScheduleStore, seconds: float) -> float:
    """CPU seconds per minute of the scheduler over idle schedules."""
    now = time.time()
    await fill(store, [record(n, now + 86_400) for n in range(IDLE)])
    lags: list[float] = []
    async with scheduler(store, lags):
        await asyncio.sleep(1.5)  # the first rounds (reading the file) are not idle
        cpu = time.process_time()
        await asyncio.sleep(seconds)
        used = time.process_time() - cpu
    assert not lags
    return used * 60 / seconds


async def idle_floor(seconds: float) -> float:
    cpu = time.process_time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # noqa: ASYNC110 - the floor is exactly this poller
        await asyncio.sleep(1.0)
    return (time.process_time() - cpu) * 60 / seconds


async def lag(store: ScheduleStore, due: int) -> list[float]:
    # Placed after the fill (which takes a while with PostgreSQL), so none is due before.
    filled = time.time()
    await fill(store, [record(IDLE + n, filled + n / RATE) for n in range(due)])
    shift = 2 * (time.time() - filled) + 2.0  # the second fill takes as long again
    await fill(store, [record(IDLE + n, filled + shift + n / RATE) for n in range(due)])
    lags: list[float] = []
    async with scheduler(store, lags):
        async with asyncio.timeout(due / RATE + 60):
            while len(lags) < due:  # noqa: ASYNC110 - a bench's progress check
                await asyncio.sleep(0.1)
    return lags


async def lag_floor(due: int) -> list[float]:
    loop = asyncio.get_running_loop()
    start = time.time() + 1.0
    lags: list[float] = []
    done = asyncio.Event()
    offset = loop.time() - time.time()
    for n in range(due):
        at = start + n / RATE

        def hit(at: float = at) -> None:
            lags.append(time.time() - at)
            if len(lags) == due:
                done.set()

        loop.call_at(at + offset, hit)
    await done.wait()
    return lags


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def pg_store(url: str) -> tuple[ScheduleStore, Any, str]:
    import secrets

    import asyncpg

    from sessions.postgres import schema as pg_schema
    from sessions.postgres.schedules import PostgresScheduleStore
    from sessions.postgres.store import PostgresSessionStore

    name = f"gw_bench_{secrets.token_hex(4)}"
    conn = await asyncpg.connect(url)
    try:
        await pg_schema.upgrade(conn, name)
    finally:
        await conn.close()
    sessions = await PostgresSessionStore.connect(url, schema=name)
    return PostgresScheduleStore(sessions), sessions, name


async def drop(url: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP SCHEMA "{name}" CASCADE')
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=30.0, help="idle window (s)")
    parser.add_argument("--due", type=int, default=3000, help="occurrences for the lag")
    parser.add_argument("--pg", default=None, help="postgresql:// URL (skip PostgreSQL: none)")
    args = parser.parse_args()
    rows: list[str] = []
    floor = await idle_floor(args.idle)
    floor_lags = await lag_floor(args.due)
    rows.append(f"| floor (loop waking 1/s; call_at) | {floor * 1000:.1f} ms | - | "
                f"{pct(floor_lags, 0.5):.2f} | {pct(floor_lags, 0.99):.2f} |")
    with tempfile.TemporaryDirectory() as tmp:
        store = FileScheduleStore(Path(tmp) / "state")
        cpu = await idle_cpu(store, args.idle)
        lags = await lag(store, args.due)
        await store.aclose()
        rows.append(f"| file store | {cpu * 1000:.1f} ms | {cpu / floor:.2f}x | "
                    f"{pct(lags, 0.5):.2f} | {pct(lags, 0.99):.2f} |")
    if args.pg:
        store, sessions, name = await pg_store(args.pg)
        try:
            cpu = await idle_cpu(store, args.idle)
            lags = await lag(store, args.due)
        finally:
            await sessions.aclose()
            await drop(args.pg, name)
        rows.append(f"| PostgreSQL store | {cpu * 1000:.1f} ms | {cpu / floor:.2f}x | "
                    f"{pct(lags, 0.5):.2f} | {pct(lags, 0.99):.2f} |")
    report = "\n".join([
        f"# Scheduler cost ({time.strftime('%Y-%m-%d')})", "",
        f"{IDLE:,} idle schedules; idle window {args.idle:g} s; {args.due} occurrences due "
        f"at {RATE:g} per second.", "",
        "| case | CPU per idle minute | vs floor | lag p50 (ms) | lag p99 (ms) |",
        "|---|---|---|---|---|", *rows, ""])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "schedule.md").write_text(report)
    print(report)


if __name__ == "__main__":
    asyncio.run(main())
