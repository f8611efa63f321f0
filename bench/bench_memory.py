"""Benchmark: a worker's memory over 100,000 messages (not a test: it takes a while).

One real ``gateway run`` worker (web channel, offline provider: the gateway's own memory,
no model's) on a private PostgreSQL and Redis (``--store postgres``, the workers' mode) or
on JSONL files (``--store jsonl``, one process). ``--conversations`` chats take turns: each
round sends one message to every chat (``--in-flight`` at once), so every conversation grows
by a turn a round and the worker sees each of them again after all the others, as a
worker serving many people does. RSS (``psutil``) and the open conversations
(``/healthz``) are sampled every ``--every`` messages, then while idle for ``--idle``
seconds after the last.

What it shows: whether RSS keeps growing with the messages (a leak) or levels off where the
open-session cache is full (``GATEWAY_OPEN_SESSIONS_MEMORY``, given here as
``--open-memory``), and whether it stays there when idle.

Run: .venv/bin/python bench/bench_memory.py [--messages 100000] [--conversations 2000]
     [--store postgres] [--open-memory 67108864]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import psutil
from _fleet import BenchPostgres, BenchRedis, describe_tree, load, tree_env

from tests.coordination.cluster import WorkerProcess, start_workers, stop_workers

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Sample:
    messages: int
    seconds: float
    rss: float
    open: int | None
    note: str = ""


async def health(http: aiohttp.ClientSession, worker: WorkerProcess) -> int | None:
    with contextlib.suppress(aiohttp.ClientError, ValueError, KeyError):
        async with http.get(f"{worker.base}/healthz") as response:
            body = await response.json()
            return int(body["open_conversations"])
    return None


async def sample(http: aiohttp.ClientSession, worker: WorkerProcess, sent: int,
                 started: float, note: str = "") -> Sample:
    rss = psutil.Process(worker.proc.pid).memory_info().rss / 2**20
    return Sample(sent, time.monotonic() - started, rss, await health(http, worker), note)


async def drive(worker: WorkerProcess, args: argparse.Namespace) -> list[Sample]:
    samples: list[Sample] = []
    gate = asyncio.Semaphore(args.in_flight)
    sent = errors = 0
    started = time.monotonic()
    connector = aiohttp.TCPConnector(limit=args.in_flight * 2)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=120)) as http:
        samples.append(await sample(http, worker, 0, started, "start"))

        async def one(conv: int, n: int) -> None:
            nonlocal errors
            text = f"message {n} of chat {conv}: " + "words " * args.words
            body = {"conversation": f"c{conv}", "text": text, "id": f"c{conv}-{n}"}
            async with gate, http.post(f"{worker.base}/api/chat", json=body) as response:
                if response.status != 200:
                    errors += 1
                await response.read()

        n = 0
        while sent < args.messages:
            batch = min(args.conversations, args.messages - sent)
            async with asyncio.TaskGroup() as tg:
                for conv in range(batch):
                    tg.create_task(one(conv, n))
            before = sent
            sent += batch
            n += 1
            if sent // args.every != before // args.every or sent == args.messages:
                samples.append(await sample(http, worker, sent, started))
                print(f"{sent} messages: RSS {samples[-1].rss:.1f} MiB, open "
                      f"{samples[-1].open}, errors {errors}", flush=True)
        for _ in range(3):
            await asyncio.sleep(args.idle / 3)
            samples.append(await sample(http, worker, sent, started, "idle"))
    if errors:
        samples.append(Sample(sent, time.monotonic() - started, 0.0, None, f"{errors} errors"))
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--every", type=int, default=5000)
    parser.add_argument("--words", type=int, default=20, help="words of text a message")
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--store", choices=("postgres", "jsonl"), default="postgres")
    parser.add_argument("--open-memory", type=int, default=None,
                        help="GATEWAY_OPEN_SESSIONS_MEMORY (default: the gateway's)")
    parser.add_argument("--tree", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "memory.md")
    args = parser.parse_args()
    started = load()
    extra = {**tree_env(args.tree), "GATEWAY_MAX_CONCURRENT_TURNS": "auto"}
    if args.open_memory is not None:
        extra["GATEWAY_OPEN_SESSIONS_MEMORY"] = str(args.open_memory)
    pg = redis = None
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        try:
            if args.store == "postgres":
                pg, redis = BenchPostgres(fsync=False), BenchRedis()
                pg.create()
                redis.create()
                await pg.prepare("gateway", args.tree)
                workers = await start_workers(1, tmp=Path(tmp), schema="gateway", prefix="gw:",
                                              lease_ttl=15.0, store_url=pg.url,
                                              redis_url=redis.url, extra=extra)
            else:
                extra.update(GATEWAY_STORE_URL="", GATEWAY_REDIS_URL="",
                             GATEWAY_DURABILITY="none")
                workers = await start_workers(1, tmp=Path(tmp), schema="gateway", prefix="gw:",
                                              extra=extra)
            try:
                samples = await drive(workers[0], args)
            finally:
                await stop_workers(workers)
        finally:
            if pg is not None:
                pg.destroy()
            if redis is not None:
                redis.destroy()
    lines = [
        "## Memory over time",
        "",
        f"`.venv/bin/python bench/bench_memory.py --messages {args.messages} --conversations "
        f"{args.conversations} --in-flight {args.in_flight} --words {args.words} --store "
        f"{args.store}" + (f" --open-memory {args.open_memory}" if args.open_memory else "")
        + f"` (code: {describe_tree(args.tree)}; load {started} at the start, {load()} at "
        "the end)",
        "",
        "| messages | seconds | RSS (MiB) | open conversations | |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {s.messages} | {s.seconds:.0f} | {s.rss:.1f} | "
              f"{'-' if s.open is None else s.open} | {s.note} |" for s in samples]
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    asyncio.run(main())
