"""Benchmark: 1 vs 2 vs 3 gateway workers sharing Redis and PostgreSQL (web chat, offline model).

Workload per run: ``--conversations`` chats of ``--messages`` messages each. A chat sends its
next message once the reply to the previous one has come (as a person does); at most
``--in-flight`` requests are open at once; each message goes to a random worker
(``POST /api/chat``, a client id per message). Every reply is checked: HTTP 200 and the
offline provider's quote of its own message. The offline provider answers at once, so the
numbers are the gateway's own cost: routing, leases, relaying and PostgreSQL commits.

Subjects, each on a fresh PostgreSQL schema and Redis prefix, every worker a real
``python -m gateway run`` process:

* floor: one worker without Redis (the single-process gateway, same PostgreSQL store);
* 1, 2 and 3 workers with ``GATEWAY_REDIS_URL`` (the stateless-worker mode), each message
  sent to a random worker;
* 2 and 3 workers, *sticky*: every message of a chat goes to the same worker (as a load
  balancer with affinity would send them), which shows what the hand-offs between workers
  cost: the session re-read by a worker that did not serve the chat last, and replies relayed
  through Redis to the worker holding the request.

Reported per subject, as medians of ``--rounds`` rounds (the order of subjects rotates each
round, so drift in the load of a shared machine spreads over all of them): messages/s, p50 and
p99 latency (send to reply), throughput against the floor, CPU seconds the workers spent per
message, and how busy the machine's CPUs were during the run (all processes: workers, client,
PostgreSQL, Redis, and anything else running).

Run: .venv/bin/python bench/bench_workers.py [--conversations 60] [--messages 10]
     [--in-flight 32] [--rounds 3] [--out bench/out/workers.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import secrets
import signal
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import asyncpg
import psutil
import redis.asyncio as aioredis

from gateway.persona.workspace import seed_if_empty
from sessions.postgres import schema as pg_schema

ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("GATEWAY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SUBJECTS = ("floor", "1 worker", "2 workers", "3 workers", "2 workers, sticky",
            "3 workers, sticky")


@dataclass
class Run:
    subject: str
    seconds: float
    latencies: list[float]
    worker_cpu: float
    machine_busy: float
    errors: int = 0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


@dataclass
class Cluster:
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    def cpu_seconds(self) -> float:
        total = 0.0
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(proc.pid).cpu_times()
                total += times.user + times.system
        return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start(count: int, *, shared: bool, tmp: Path, schema: str, prefix: str) -> Cluster:
    persona = tmp / "persona"
    seed_if_empty(persona, "Lisa")
    env = {
        **os.environ, "GATEWAY_CHANNELS": "web", "GATEWAY_PROVIDER": "offline",
        "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PERSONA_DIR": str(persona),
        "GATEWAY_STORE_URL": PG_URL, "GATEWAY_STORE_SCHEMA": schema,
        "GATEWAY_LOG_LEVEL": "WARNING", "GATEWAY_STREAM": "false",
        "GATEWAY_MAX_CONCURRENT_TURNS": "64", "PYTHONPATH": str(ROOT),
    }
    if shared:
        env.update(GATEWAY_REDIS_URL=REDIS_URL, GATEWAY_REDIS_PREFIX=prefix)
    cluster = Cluster()
    for n in range(count):
        port = free_port()
        log = (tmp / f"worker{n}.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "run", cwd=tmp, stdout=log, stderr=log,
            env={**env, "GATEWAY_PORT": str(port), "GATEWAY_DATA_DIR": str(tmp / f"w{n}")})
        log.close()
        cluster.procs.append(proc)
        cluster.ports.append(port)
    async with aiohttp.ClientSession() as http, asyncio.timeout(60):
        for port in cluster.ports:
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                        if response.status == 200:
                            break
                await asyncio.sleep(0.1)
    return cluster


async def stop(cluster: Cluster) -> None:
    for proc in cluster.procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    for proc in cluster.procs:
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def workload(ports: list[int], conversations: int, messages: int, in_flight: int,
                   tag: str, sticky: bool) -> tuple[float, list[float], int]:
    """Run the chats; (seconds, latency of every reply, errors)."""
    rng = random.Random(tag)
    gate = asyncio.Semaphore(in_flight)
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=in_flight * 2)

    async def chat(http: aiohttp.ClientSession, conv: str, home: int) -> None:
        nonlocal errors
        for i in range(messages):
            text = f"message {i} of {conv}"
            body = {"conversation": conv, "text": text, "id": f"{conv}-{i}"}
            port = home if sticky else rng.choice(ports)
            async with gate:
                sent = time.perf_counter()
                async with http.post(f"http://127.0.0.1:{port}/api/chat", json=body) as resp:
                    data = await resp.json()
                took = time.perf_counter() - sent
            if resp.status != 200 or text not in str(data.get("reply", "")):
                errors += 1
            latencies.append(took)

    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=300)) as http:
        started = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for c in range(conversations):
                tg.create_task(chat(http, f"{tag}-c{c}", ports[c % len(ports)]))
        return time.perf_counter() - started, latencies, errors


async def one_run(subject: str, args: argparse.Namespace) -> Run:
    count = 1 if subject == "floor" else int(subject.split()[0])
    schema = f"gw_bench_{secrets.token_hex(4)}"
    prefix = f"gwbench:{secrets.token_hex(6)}:"
    conn = await asyncpg.connect(PG_URL)
    try:
        await pg_schema.upgrade(conn, schema)
    finally:
        await conn.close()
    redis = aioredis.Redis.from_url(REDIS_URL)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
            cluster = await start(count, shared=subject != "floor", tmp=Path(tmp),
                                  schema=schema, prefix=prefix)
            try:
                cpu_before = cluster.cpu_seconds()
                machine_before = psutil.cpu_times()
                seconds, latencies, errors = await workload(
                    cluster.ports, args.conversations, args.messages, args.in_flight,
                    secrets.token_hex(3), sticky="sticky" in subject)
                machine_after = psutil.cpu_times()
                cpu = cluster.cpu_seconds() - cpu_before
            finally:
                await stop(cluster)
    finally:
        keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
        conn = await asyncpg.connect(PG_URL)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {pg_schema.quoted(schema)} CASCADE")
        finally:
            await conn.close()
    idle = machine_after.idle - machine_before.idle
    total = sum(machine_after) - sum(machine_before)
    busy = 1.0 - idle / total if total else 0.0
    return Run(subject, seconds, latencies, cpu, busy, errors)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(runs: dict[str, list[Run]], args: argparse.Namespace, load: tuple[float, ...]
           ) -> str:
    total = args.conversations * args.messages
    floor_rate = statistics.median(r.rate for r in runs["floor"])
    lines = [
        "## Workers: 1 vs 2 vs 3 on Redis + PostgreSQL",
        "",
        f"`.venv/bin/python bench/bench_workers.py --conversations {args.conversations} "
        f"--messages {args.messages} --in-flight {args.in_flight} --rounds {args.rounds}` "
        f"({total} messages per run; medians of {args.rounds} rounds)",
        "",
        f"Machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} before the runs.",
        "",
        "| subject | messages/s | p50 latency | p99 latency | vs floor | worker CPU ms/msg "
        "| machine CPU busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for subject in SUBJECTS:
        group = runs[subject]
        rate = statistics.median(r.rate for r in group)
        p50 = statistics.median(pct(r.latencies, 0.50) for r in group) * 1000
        p99 = statistics.median(pct(r.latencies, 0.99) for r in group) * 1000
        cpu = statistics.median(r.worker_cpu / len(r.latencies) for r in group) * 1000
        busy = statistics.median(r.machine_busy for r in group) * 100
        lines.append(f"| {subject} | {rate:.0f} | {p50:.0f} ms | {p99:.0f} ms | "
                     f"{rate / floor_rate:.2f}x | {cpu:.1f} | {busy:.0f}% |")
    lines += ["", "Per run (messages/s): " + "; ".join(
        f"{s}: " + ", ".join(f"{r.rate:.0f}" for r in runs[s]) for s in SUBJECTS)]
    errors = sum(r.errors for group in runs.values() for r in group)
    lines += ["", f"Replies checked: {errors} wrong or missing."]
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=60)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "workers.md")
    args = parser.parse_args()
    load = os.getloadavg()
    runs: dict[str, list[Run]] = {s: [] for s in SUBJECTS}
    for round_no in range(args.rounds):
        order = SUBJECTS[round_no % len(SUBJECTS):] + SUBJECTS[:round_no % len(SUBJECTS)]
        for subject in order:
            run = await one_run(subject, args)
            runs[subject].append(run)
            print(f"round {round_no + 1} {subject}: {run.rate:.0f} msg/s, p50 "
                  f"{pct(run.latencies, 0.5) * 1000:.0f} ms, p99 "
                  f"{pct(run.latencies, 0.99) * 1000:.0f} ms, worker CPU "
                  f"{run.worker_cpu / len(run.latencies) * 1000:.1f} ms/msg, machine busy "
                  f"{run.machine_busy * 100:.0f}%, errors {run.errors}", flush=True)
    text = report(runs, args, load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
