"""Benchmark: a fleet of workers under realistic chat traffic, and what 10 workers need.

**Set-up** (all on this machine, servers of the benchmark's own): ``--workers`` real
``gateway run`` processes (web channel, the openai provider) sharing one private PostgreSQL
(``fsync`` on: a commit waits for the disk) and one private Redis; a model server in its own
process (``bench/_model_server.py``) that answers each message after the delay the message
names; the chat clients in this process.

**Traffic** (open loop: it does not slow down when the gateway does): ``--population``
conversations, of which bursts of activity start at random (``--bursts`` a second, a Poisson
process, each in a conversation picked at random: most of the population stays idle, some
speak several times). A burst is a person sending ``--messages`` messages on average
(geometric), one at a time: each after the reply to the one before and a think time
(exponential, mean ``--think`` seconds). The model's latency is log-uniform between 1 and
10 s, drawn per message. Messages go to the worker their conversation hashes to
(``sticky``, as a load balancer with affinity sends them) or to the next worker in turn
(``round-robin``).

**Measured** over the run after ``--warmup`` seconds: messages answered a second; the reply's
latency beyond the model's (send to reply, less the delay the model was told to take), p50
and p99; CPU per message of each component (the workers, PostgreSQL's processes, Redis, the
model server, the clients: ``psutil``); PostgreSQL statements, write transactions and Redis
commands per message (``pg_stat_statements``, transaction ids, ``INFO commandstats``);
active chats (conversations in a burst) and turns in flight.

**Extrapolated** (the model is printed with the figures): per-message costs are taken as
constant, so 10,000 active chats, each sending a message every (think + model latency +
gateway latency) seconds, make M messages a second; each component needs M x its CPU per
message of a core (at 70 % utilisation), PostgreSQL M x commits per message commits a second,
and every worker holds M/workers x mean model latency turns in flight.

Run: .venv/bin/python bench/bench_fleet.py [--workers 1,2,4] [--routing sticky,round-robin]
     [--population 5000] [--bursts 8] [--messages 4] [--think 6] [--duration 120]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import psutil
from _fleet import (
    BenchPostgres,
    BenchRedis,
    PgCounts,
    counter_minus,
    describe_tree,
    load,
    pg_counts,
    process_tree_cpu,
    redis_counts,
    tree_env,
)

from tests.coordination.cluster import WorkerProcess, start_workers, stop_workers

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("workers", "PostgreSQL", "Redis", "model server", "clients")
UTILISATION = 0.7


@dataclass
class Sample:
    sent: float
    latency: float
    model: float
    ok: bool


@dataclass
class Snapshot:
    at: float
    cpu: dict[str, float]
    pg: PgCounts
    redis: Counter[str]


@dataclass
class Result:
    workers: int
    routing: str
    seconds: float
    samples: list[Sample]
    cpu: dict[str, float]
    statements: Counter[str]
    xids: int
    redis_commands: int
    idle_seconds: float
    idle_cpu: dict[str, float]
    idle_statements: Counter[str]
    idle_xids: int
    idle_redis: int
    active: list[int] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)

    @property
    def answered(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def rate(self) -> float:
        return len(self.answered) / self.seconds

    def busy(self, value: float, idle: float) -> float:
        """What the traffic cost: ``value`` over the run less the idle rate over as long."""
        return value - idle / self.idle_seconds * self.seconds

    def per_message(self, value: float, idle: float) -> float:
        return self.busy(value, idle) / max(1, len(self.answered))


class Traffic:
    """The open-loop chat clients (see the module docstring)."""

    def __init__(self, workers: list[WorkerProcess], args: argparse.Namespace, routing: str,
                 seed: int) -> None:
        self.workers = workers
        self.args = args
        self.routing = routing
        self.rng = random.Random(seed)
        self.samples: list[Sample] = []
        self.active = 0
        self.in_flight = 0
        self.turn = 0
        self.busy: set[int] = set()
        self.sent = 0

    def worker(self, conversation: int) -> WorkerProcess:
        if self.routing == "sticky":
            return self.workers[zlib.crc32(str(conversation).encode()) % len(self.workers)]
        self.turn += 1
        return self.workers[self.turn % len(self.workers)]

    async def run(self, http: aiohttp.ClientSession, until: float) -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.TaskGroup() as tg:
            while loop.time() < until:
                await asyncio.sleep(self.rng.expovariate(self.args.bursts))
                conversation = self.rng.randrange(self.args.population)
                if conversation in self.busy:  # a person speaks in one burst at a time
                    continue
                tg.create_task(self.burst(http, conversation, until))

    async def burst(self, http: aiohttp.ClientSession, conversation: int, until: float) -> None:
        loop = asyncio.get_running_loop()
        self.busy.add(conversation)
        self.active += 1
        try:
            count = 1
            while self.rng.random() > 1 / self.args.messages:
                count += 1
            for _ in range(count):
                if loop.time() >= until:
                    return
                await self.message(http, conversation)
                await asyncio.sleep(self.rng.expovariate(1 / self.args.think))
        finally:
            self.active -= 1
            self.busy.discard(conversation)

    async def message(self, http: aiohttp.ClientSession, conversation: int) -> None:
        model = math.exp(self.rng.uniform(math.log(1.0), math.log(10.0)))
        self.sent += 1
        text = f"m{self.sent} delay={model:.3f}"
        body = {"conversation": f"c{conversation}", "text": text, "id": f"m{self.sent}"}
        worker = self.worker(conversation)
        started = time.monotonic()
        self.in_flight += 1
        ok = False
        try:
            async with http.post(f"{worker.base}/api/chat", json=body) as response:
                data = await response.json()
            ok = response.status == 200 and text in str(data.get("reply", ""))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            ok = False
        finally:
            self.in_flight -= 1
        took = time.monotonic() - started
        self.samples.append(Sample(started, took, model, ok))


def cpu_now(pids: dict[str, list[int]]) -> dict[str, float]:
    out = {}
    for name, group in pids.items():
        total = 0.0
        for pid in group:
            if name == "PostgreSQL":
                total += process_tree_cpu(pid)
                continue
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
        out[name] = total
    return out


async def snapshot(pids: dict[str, list[int]], pg: BenchPostgres, redis: BenchRedis) -> Snapshot:
    return Snapshot(time.monotonic(), cpu_now(pids), await pg_counts(pg.url),
                    await redis_counts(redis.url))


async def start_model() -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "_model_server.py"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    return proc, int(line)


async def one(workers: int, routing: str, args: argparse.Namespace) -> Result:
    pg, redis = BenchPostgres(fsync=True, max_connections=200), BenchRedis()
    pg.create()
    redis.create()
    model, port = await start_model()
    try:
        await pg.prepare("gateway", args.tree)
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
            fleet = await start_workers(
                workers, tmp=Path(tmp), schema="gateway", prefix="gw:", lease_ttl=15.0,
                store_url=pg.url, redis_url=redis.url,
                extra={**tree_env(args.tree), "GATEWAY_PROVIDER": "openai",
                       "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                       "OPENAI_API_KEY": "bench", "GATEWAY_MAX_CONCURRENT_TURNS": "auto",
                       "GATEWAY_TYPING_DELAY": "30"})
            try:
                return await measure(fleet, routing, args, pg, redis, model.pid)
            finally:
                await stop_workers(fleet)
    finally:
        if model.returncode is None:
            model.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(model.wait(), 10)
        pg.destroy()
        redis.destroy()


async def measure(fleet: list[WorkerProcess], routing: str, args: argparse.Namespace,
                  pg: BenchPostgres, redis: BenchRedis, model_pid: int) -> Result:
    pids = {"workers": [w.proc.pid for w in fleet], "PostgreSQL": [pg.pid()],
            "Redis": [redis.pid()], "model server": [model_pid], "clients": [os.getpid()]}
    traffic = Traffic(fleet, args, routing, seed=len(fleet) * 7919 + len(routing))
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=0)
    active: list[int] = []
    in_flight: list[int] = []
    rss: list[float] = []
    marks: dict[str, Snapshot] = {}
    stats: list[float] = []
    # What the workers and servers do with no traffic at all (renewals, sweeps, polls,
    # the servers' own housekeeping), measured first and subtracted per second.
    idle_start = await snapshot(pids, pg, redis)
    await asyncio.sleep(args.idle)
    idle_end = await snapshot(pids, pg, redis)
    start = loop.time()
    until = start + args.warmup + args.duration

    async def sampler() -> None:
        await asyncio.sleep(args.warmup)
        marks["start"] = await snapshot(pids, pg, redis)
        stats.append(loop.time())
        while loop.time() < until:
            await asyncio.sleep(1.0)
            active.append(traffic.active)
            in_flight.append(traffic.in_flight)
            rss.append(sum(psutil.Process(p).memory_info().rss for p in pids["workers"])
                       / len(fleet) / 2**20)
        marks["end"] = await snapshot(pids, pg, redis)

    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=300)) as http, \
            asyncio.TaskGroup() as tg:
        tg.create_task(sampler())
        tg.create_task(traffic.run(http, until))
    begin, end = marks["start"], marks["end"]
    window = [s for s in traffic.samples
              if begin.at <= s.sent and s.sent + s.latency <= end.at]
    pg_delta, pg_idle = end.pg.minus(begin.pg), idle_end.pg.minus(idle_start.pg)
    return Result(len(fleet), routing, end.at - begin.at, window,
                  {k: end.cpu[k] - begin.cpu[k] for k in COMPONENTS},
                  pg_delta.statements, pg_delta.xids,
                  sum(counter_minus(end.redis, begin.redis).values()),
                  idle_end.at - idle_start.at,
                  {k: idle_end.cpu[k] - idle_start.cpu[k] for k in COMPONENTS},
                  pg_idle.statements, pg_idle.xids,
                  sum(counter_minus(idle_end.redis, idle_start.redis).values()),
                  active, in_flight, rss)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(results: list[Result], args: argparse.Namespace, started: str) -> str:
    lines = [
        "## Fleet simulation",
        "",
        f"`.venv/bin/python bench/bench_fleet.py --workers {args.workers} --routing "
        f"{args.routing} --population {args.population} --bursts {args.bursts} --messages "
        f"{args.messages} --think {args.think} --duration {args.duration} --warmup "
        f"{args.warmup} --idle {args.idle}" + (f" --tree {args.tree}" if args.tree else "")
        + "` (code: "
        f"{describe_tree(args.tree)}; {os.cpu_count()} CPUs; load {started} at the start, "
        f"{load()} at the end)",
        "",
        "| workers | routing | messages/s | beyond the model p50 / p99 | lost | active chats "
        "(mean) | turns in flight (mean) | worker RSS (MiB, mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        extra = [s.latency - s.model for s in r.answered]
        lost = len(r.samples) - len(r.answered)
        lines.append(
            f"| {r.workers} | {r.routing} | {r.rate:.1f} | {pct(extra, 0.5) * 1000:.0f} / "
            f"{pct(extra, 0.99) * 1000:.0f} ms | {lost} | {statistics.mean(r.active):.0f} | "
            f"{statistics.mean(r.in_flight):.0f} | {statistics.mean(r.rss):.0f} |")
    lines += ["", "CPU per message (ms; what the same processes spend idle, measured for "
              f"{args.idle:.0f} s before the traffic, subtracted), and what the shared servers "
              "did per message:", "",
              "| workers | routing | " + " | ".join(COMPONENTS)
              + " | PostgreSQL statements | commits | Redis commands |",
              "|---|---|" + "---|" * (len(COMPONENTS) + 3)]
    for r in results:
        lines.append(
            f"| {r.workers} | {r.routing} | "
            + " | ".join(f"{r.per_message(r.cpu[c], r.idle_cpu[c]) * 1000:.2f}"
                         for c in COMPONENTS)
            + f" | {r.per_message(sum(r.statements.values()), sum(r.idle_statements.values())):.1f}"
            f" | {r.per_message(r.xids, r.idle_xids):.1f}"
            f" | {r.per_message(r.redis_commands, r.idle_redis):.1f} |")
    lines += ["", "Idle, per second (all workers together): " + ", ".join(
        f"{r.workers} {r.routing}: workers {r.idle_cpu['workers'] / r.idle_seconds * 1000:.0f}"
        f" ms, PostgreSQL {r.idle_cpu['PostgreSQL'] / r.idle_seconds * 1000:.0f} ms of CPU, "
        f"{sum(r.idle_statements.values()) / r.idle_seconds:.1f} statements"
        for r in results) + "."]
    top = max(results, key=lambda r: (r.routing == "sticky", r.workers))
    lines += ["", f"Statements per message ({top.workers} worker(s), {top.routing}; idle "
              "subtracted):", "", "| per message | statement |", "|---|---|"]
    net = {q: top.per_message(c, top.idle_statements.get(q, 0))
           for q, c in top.statements.items()}
    for query, calls in sorted(net.items(), key=lambda kv: -kv[1])[:14]:
        if calls >= 0.02:
            lines.append(f"| {calls:.2f} | `{short(query)}` |")
    lines += extrapolate(results, args)
    return "\n".join(lines) + "\n"


def short(statement: str, width: int = 110) -> str:
    text = " ".join(statement.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def extrapolate(results: list[Result], args: argparse.Namespace) -> list[str]:
    """10 workers and 10,000 active chats, from the run with the most workers (sticky)."""
    base = max(results, key=lambda r: (r.routing == "sticky", r.workers))
    per = {c: base.per_message(base.cpu[c], base.idle_cpu[c]) for c in COMPONENTS}
    idle_worker = base.idle_cpu["workers"] / base.idle_seconds / base.workers
    statements = base.per_message(sum(base.statements.values()),
                                  sum(base.idle_statements.values()))
    commits = base.per_message(base.xids, base.idle_xids)
    commands = base.per_message(base.redis_commands, base.idle_redis)
    mean_model = statistics.mean(s.model for s in base.answered)
    beyond = statistics.mean(s.latency - s.model for s in base.answered)
    chats = 10_000
    cycle = args.think + mean_model + beyond  # one message of an active chat every `cycle` s
    rate = chats / cycle
    workers = 10
    lines = [
        "",
        f"**Extrapolated** from {base.workers} worker(s), {base.routing} (model: each cost per "
        "message stays what was measured; an active chat sends a message every think + model "
        "+ gateway seconds; a component is sized for 70 % of its cores):",
        "",
        f"* {chats:,} active chats x 1 message every {cycle:.1f} s (think {args.think:.0f} s + "
        f"model {mean_model:.1f} s + gateway {beyond:.2f} s) = **{rate:.0f} messages/s**.",
        f"* Workers: {rate:.0f} x {per['workers'] * 1000:.2f} ms + {workers} x "
        f"{idle_worker * 1000:.0f} ms/s idle = {rate * per['workers'] + workers * idle_worker:.1f}"
        f" cores, so **{math.ceil((rate * per['workers'] + workers * idle_worker) / UTILISATION)}"
        f" worker cores** at 70 % ({rate / workers:.0f} messages/s and "
        f"{rate / workers * mean_model:.0f} turns in flight per worker at {workers} workers).",
        f"* PostgreSQL: {rate * per['PostgreSQL']:.2f} cores, {rate * commits:.0f} commits/s, "
        f"{rate * statements:.0f} statements/s; {workers} workers x pool 5 = {workers * 5} "
        "connections.",
        f"* Redis: {rate * per['Redis']:.2f} cores, {rate * commands:.0f} commands/s.",
    ]
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--routing", default="sticky,round-robin")
    parser.add_argument("--population", type=int, default=5000)
    parser.add_argument("--bursts", type=float, default=8.0, help="bursts starting a second")
    parser.add_argument("--messages", type=float, default=4.0, help="mean messages a burst")
    parser.add_argument("--think", type=float, default=6.0, help="mean seconds between")
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--idle", type=float, default=15.0,
                        help="seconds measured with no traffic first (subtracted)")
    parser.add_argument("--tree", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "fleet.md")
    args = parser.parse_args()
    started = load()
    results = []
    for count in (int(w) for w in args.workers.split(",")):
        for routing in args.routing.split(","):
            if count == 1 and routing != args.routing.split(",")[0]:
                continue  # one worker: routing makes no difference
            result = await one(count, routing, args)
            extra = [s.latency - s.model for s in result.answered]
            print(f"{count} worker(s), {routing}: {result.rate:.1f} msg/s, beyond the model p50 "
                  f"{pct(extra, 0.5) * 1000:.0f} ms p99 {pct(extra, 0.99) * 1000:.0f} ms, "
                  f"workers {result.cpu['workers'] / max(1, len(result.answered)) * 1000:.2f} "
                  "ms/msg", flush=True)
            results.append(result)
    text = report(results, args, started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
