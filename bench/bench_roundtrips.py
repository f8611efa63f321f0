"""Benchmark: database round trips, commits and Redis commands per message, several workers.

Counts what one answered message costs the shared servers, on servers of the benchmark's own
(so nothing else is counted): a private PostgreSQL (``pg_stat_statements``) and a private
Redis, each behind a :class:`~_fleet.CountingProxy`. Workers are real ``gateway run``
processes (web channel, offline provider: it answers at once, so what is counted is the
gateway's own), sharing the PostgreSQL store and Redis.

Workload: ``--conversations`` chats of ``--messages`` messages; a chat sends its next message
once the previous one is answered (as a person does, with no pause: so a lease kept for a
moment is reused); at most ``--in-flight`` requests open. Subjects: one worker; two workers,
each message to the next worker in turn (*round-robin*); two workers, every message of a chat
to the same one (*sticky*).

Reported per message: PostgreSQL round trips (the proxy) and statements executed
(``pg_stat_statements``, by statement, the largest first); write transactions (transaction
ids handed out: each is a commit that waits for the disk); Redis round trips and commands
(``INFO commandstats``, by command). What the workers do while idle (renewals, sweeps, the
relay's poll) is measured for ``--idle`` seconds before the run and subtracted at that rate;
the run is counted until ``--settle`` seconds after its last reply (leases kept a moment
after a reply are let go meanwhile, and that is the run's work).

Run: .venv/bin/python bench/bench_roundtrips.py [--conversations 100] [--messages 10]
     [--tree DIR: another checkout's code, e.g. main before a change]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
from _fleet import (
    BenchPostgres,
    BenchRedis,
    CountingProxy,
    PgCounts,
    Wire,
    counter_minus,
    describe_tree,
    load,
    pg_counts,
    redis_counts,
    tree_env,
)

from tests.coordination.cluster import WorkerProcess, start_workers, stop_workers

ROOT = Path(__file__).resolve().parents[1]
SUBJECTS = {"one": "1 worker", "rr": "2 workers, round-robin", "sticky": "2 workers, sticky"}


@dataclass
class Counts:
    pg_wire: Wire
    redis_wire: Wire
    pg: PgCounts
    redis: Counter[str]
    seconds: float

    def minus(self, other: Counts) -> Counts:
        return Counts(self.pg_wire.minus(other.pg_wire), self.redis_wire.minus(other.redis_wire),
                      self.pg.minus(other.pg), counter_minus(self.redis, other.redis),
                      self.seconds - other.seconds)


@dataclass
class Result:
    subject: str
    messages: int
    errors: int
    busy: Counts
    idle: Counts

    def net(self) -> Counts:
        """The run's counts less what the workers do idle over as long (scaled)."""
        scale = self.busy.seconds / self.idle.seconds if self.idle.seconds else 0.0
        b, i = self.busy, self.idle
        statements = Counter({k: v - round(i.pg.statements.get(k, 0) * scale)
                              for k, v in b.pg.statements.items()})
        commands = Counter({k: v - round(i.redis.get(k, 0) * scale) for k, v in b.redis.items()})
        return Counts(
            Wire(b.pg_wire.round_trips - round(i.pg_wire.round_trips * scale)),
            Wire(b.redis_wire.round_trips - round(i.redis_wire.round_trips * scale)),
            PgCounts(b.pg.xids - round(i.pg.xids * scale), statements), commands, b.seconds)


class Meter:
    def __init__(self, pg: BenchPostgres, redis: BenchRedis, pg_proxy: CountingProxy,
                 redis_proxy: CountingProxy) -> None:
        self.pg, self.redis, self.pg_proxy, self.redis_proxy = pg, redis, pg_proxy, redis_proxy

    async def read(self) -> Counts:
        return Counts(self.pg_proxy.snapshot(), self.redis_proxy.snapshot(),
                      await pg_counts(self.pg.url), await redis_counts(self.redis.url),
                      time.monotonic())


async def chats(workers: list[WorkerProcess], args: argparse.Namespace, sticky: bool,
                tag: str) -> int:
    """Run the workload; how many replies were wrong or missing."""
    gate = asyncio.Semaphore(args.in_flight)
    errors = 0
    turn = 0

    async def chat(http: aiohttp.ClientSession, conv: str, home: int) -> None:
        nonlocal errors, turn
        for i in range(args.messages):
            text = f"message {i} of {conv}"
            if sticky:
                worker = workers[home]
            else:
                worker, turn = workers[turn % len(workers)], turn + 1
            body = {"conversation": conv, "text": text, "id": f"{conv}-{i}"}
            async with gate, http.post(f"{worker.base}/api/chat", json=body) as resp:
                data = await resp.json()
            if resp.status != 200 or text not in str(data.get("reply", "")):
                errors += 1

    connector = aiohttp.TCPConnector(limit=args.in_flight * 2)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=300)) as http, \
            asyncio.TaskGroup() as tg:
        for c in range(args.conversations):
            tg.create_task(chat(http, f"{tag}-c{c}", c % len(workers)))
    return errors


async def one(subject: str, args: argparse.Namespace) -> Result:
    count = int(subject.split()[0])
    pg, redis = BenchPostgres(fsync=False), BenchRedis()
    pg.create()
    redis.create()
    schema = "gateway"
    try:
        await pg.prepare(schema, args.tree)
        async with CountingProxy(pg.port) as pg_proxy, CountingProxy(redis.port) as redis_proxy:
            meter = Meter(pg, redis, pg_proxy, redis_proxy)
            with tempfile.TemporaryDirectory(prefix="bench-roundtrips-") as tmp:
                workers = await start_workers(
                    count, tmp=Path(tmp), schema=schema, prefix="gw:", lease_ttl=15.0,
                    store_url=f"postgresql://postgres@127.0.0.1:{pg_proxy.port}/postgres",
                    redis_url=f"redis://127.0.0.1:{redis_proxy.port}/0",
                    extra={**tree_env(args.tree), "GATEWAY_MAX_CONCURRENT_TURNS": "1000"})
                try:
                    await asyncio.sleep(2)  # start-up queries settle
                    idle_start = await meter.read()
                    await asyncio.sleep(args.idle)  # what the workers do by themselves
                    start = await meter.read()
                    errors = await chats(workers, args, "sticky" in subject,
                                         secrets.token_hex(3))
                    # Leases kept a moment after a chat's last reply are let go meanwhile:
                    # that is the run's work too.
                    await asyncio.sleep(args.settle)
                    end = await meter.read()
                finally:
                    await stop_workers(workers)
    finally:
        pg.destroy()
        redis.destroy()
    return Result(subject, args.conversations * args.messages, errors, end.minus(start),
                  start.minus(idle_start))


def short(statement: str, width: int = 110) -> str:
    text = " ".join(statement.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def report(results: list[Result], args: argparse.Namespace, started: str) -> str:
    tree = describe_tree(args.tree)
    lines = [
        "## Round trips per message",
        "",
        f"`.venv/bin/python bench/bench_roundtrips.py --conversations {args.conversations} "
        f"--messages {args.messages} --in-flight {args.in_flight} --settle {args.settle:g}"
        + (f" --tree {args.tree}" if args.tree else "") + f"` (workers' code: {tree}; "
        f"load {started} at the start, {load()} at the end)",
        "",
        "| subject | PostgreSQL round trips | statements | write transactions (commits) "
        "| Redis round trips | Redis commands | wrong replies |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        n, net = r.messages, r.net()
        lines.append(
            f"| {r.subject} | {net.pg_wire.round_trips / n:.1f} | "
            f"{sum(net.pg.statements.values()) / n:.1f} | {net.pg.xids / n:.1f} | "
            f"{net.redis_wire.round_trips / n:.1f} | {sum(net.redis.values()) / n:.1f} | "
            f"{r.errors} |")
    for r in results:
        n, net = r.messages, r.net()
        lines += ["", f"**{r.subject}**: statements per message (idle subtracted; "
                  f"idle: {r.idle.pg_wire.round_trips / r.idle.seconds:.1f} PostgreSQL and "
                  f"{r.idle.redis_wire.round_trips / r.idle.seconds:.1f} Redis round trips "
                  "a second)", "", "| per message | statement |", "|---|---|"]
        for statement, calls in net.pg.statements.most_common(14):
            if calls / n >= 0.05:
                lines.append(f"| {calls / n:.2f} | `{short(statement)}` |")
        lines += ["", "| per message | Redis command |", "|---|---|"]
        for command, calls in net.redis.most_common():
            if calls / n >= 0.05:
                lines.append(f"| {calls / n:.2f} | `{command}` |")
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds counted after the last reply (>= the lease linger)")
    parser.add_argument("--subjects", default=",".join(SUBJECTS),
                        help="which, comma-separated: one, rr, sticky")
    parser.add_argument("--tree", type=Path, default=None,
                        help="run the workers from this checkout (e.g. main before a change)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "roundtrips.md")
    args = parser.parse_args()
    started = load()
    results = []
    for subject in [SUBJECTS[s.strip()] for s in args.subjects.split(",")]:
        result = await one(subject, args)
        net = result.net()
        print(f"{subject}: {net.pg_wire.round_trips / result.messages:.1f} PostgreSQL round "
              f"trips, {net.pg.xids / result.messages:.1f} commits, "
              f"{net.redis_wire.round_trips / result.messages:.1f} Redis round trips a message",
              flush=True)
        results.append(result)
    text = report(results, args, started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
