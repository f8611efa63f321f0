"""Benchmark: the JSONL store against the PostgreSQL store on one prompt-persist workload.

Workload: ``--sessions`` sessions x ``--calls`` calls, each call one ``persist_call`` (the
persist step's write) with small changes: the mood section changes every 5th call and
the memory section every 10th, so most calls write only the small ``call`` entry and some write
a section and a prompt entry too. Sessions run 32 at a time (the gateway's default turn cap),
each in its own task, as conversations do.

Reported per store, as medians of ``--rounds`` runs: calls/s and bytes stored per call. For
JSONL the bytes are the files' sizes; for PostgreSQL the growth of ``pg_total_relation_size``
of ``sessions`` and ``entries`` (heap, indexes, TOAST), so page and row overhead count. The
floor is the same workload into an in-memory writer that only encodes the lines, measured in
the same run; ratios are against it. JSONL ``always`` fsyncs every append, which is the
durability a PostgreSQL commit gives.

Run: .venv/bin/python bench/bench_stores.py [--sessions 200] [--calls 50] [--rounds 5]
     [--url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg

from sessions.entries import encode_line
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call
from sessions.postgres import schema as pg_schema
from sessions.postgres.store import PostgresSessionStore
from sessions.records import CallRequest, Prompt, Section
from sessions.store import Durability, SessionState, SessionWriter

CONCURRENCY = 32
SOUL = "You are Lisa, a helpful assistant. " * 40  # ~1.4 KB, never changes
TOOLS = tuple(
    {"name": f"tool_{i}", "description": f"Tool number {i}",
     "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}}
    for i in range(6)
)


def request(call: int) -> CallRequest:
    """Call ``call`` of a session: small prompt changes every 5th and 10th call."""
    prompt = Prompt.from_sections([
        Section("soul", SOUL),
        Section("memory", f"## Memory\n- fact {call // 10}"),
        Section("mood", f"## Mood\nmood {call // 5}"),
    ])
    return CallRequest(prompt=prompt, reason="rebuilt" if call else "initial", tools=TOOLS,
                       provider="anthropic", model="claude-bench",
                       params={"max_tokens": 1024}, window=((0, 2 * call + 1),))


class MemoryWriter:
    """The floor: encodes lines exactly as the stores do, keeps them in a list."""

    def __init__(self) -> None:
        self._state = SessionState()
        self.lines: list[bytes] = []

    @property
    def session_id(self) -> str:
        return "mem"

    @property
    def tenant(self) -> str:
        return "default"

    @property
    def state(self) -> SessionState:
        return self._state

    async def append(self, entries: Sequence[Mapping[str, Any]]) -> int:
        size = 0
        for item in entries:
            line = encode_line(item, self._state.next_seq, "2026-01-01T00:00:00.000Z")
            self.lines.append(line)
            size += len(line) + 1
            self._state.next_seq += 1
            kind = item.get("type")
            if kind == "section":
                self._state.sections.add(item["hash"])
            elif kind == "prompt":
                self._state.last_prompt = item["fingerprint"]
            elif kind == "tools":
                self._state.tool_sets.add(item["fingerprint"])
            elif kind == "call":
                self._state.call_count += 1
        return size

    async def sync(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def drive(open_writer: Callable[[int], Awaitable[SessionWriter]], sessions: int,
                calls: int) -> float:
    """Seconds to run the workload; ``open_writer(i)`` starts session ``i``."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(sessions):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            writer = await open_writer(queue.get_nowait())
            for call in range(calls):
                await persist_call(writer, request(call))
            await writer.sync()
            await writer.aclose()

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(CONCURRENCY):
            group.create_task(worker())
    return time.perf_counter() - started


async def run_memory(sessions: int, calls: int) -> tuple[float, float]:
    writers: list[MemoryWriter] = []

    async def open_writer(i: int) -> SessionWriter:
        writers.append(MemoryWriter())
        return writers[-1]

    seconds = await drive(open_writer, sessions, calls)
    size = sum(len(line) + 1 for w in writers for line in w.lines)
    return seconds, size


async def run_jsonl(sessions: int, calls: int, durability: Durability) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = JsonlSessionStore(Path(tmp), durability=durability)

        async def open_writer(i: int) -> SessionWriter:
            return await store.create(channel="bench", conversation=f"c{i}", session_id=f"s{i}")

        seconds = await drive(open_writer, sessions, calls)
        size = sum(p.stat().st_size for p in (Path(tmp) / "sessions").glob("*.jsonl"))
        await store.aclose()
    return seconds, size


async def run_postgres(url: str, sessions: int, calls: int) -> tuple[float, float]:
    schema = f"gw_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(url)
    try:
        await pg_schema.upgrade(admin, schema)
        sizes = (f"SELECT pg_total_relation_size('{schema}.sessions')"
                 f" + pg_total_relation_size('{schema}.entries')")
        before = int(await admin.fetchval(sizes))
        store = await PostgresSessionStore.connect(url, schema=schema, max_size=CONCURRENCY)
        try:
            async def open_writer(i: int) -> SessionWriter:
                return await store.create(channel="bench", conversation=f"c{i}",
                                          session_id=f"s{i}")

            seconds = await drive(open_writer, sessions, calls)
        finally:
            await store.aclose()
        size = int(await admin.fetchval(sizes)) - before
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {pg_schema.quoted(schema)} CASCADE")
        await admin.close()
    return seconds, size


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    total = args.sessions * args.calls
    runners: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
        "floor (in-memory encode)": lambda: run_memory(args.sessions, args.calls),
        "JSONL, durability none": lambda: run_jsonl(args.sessions, args.calls, "none"),
        "JSONL, durability always (fsync per append)":
            lambda: run_jsonl(args.sessions, args.calls, "always"),
        "PostgreSQL (commit per append)": lambda: run_postgres(args.url, args.sessions,
                                                               args.calls),
    }
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    sizes: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):  # interleaved, so drift in machine load hits every store
        for name, run in runners.items():
            took, size = await run()
            seconds[name].append(took)
            sizes[name].append(size)
    floor = statistics.median(seconds["floor (in-memory encode)"])
    lines = [
        "## Stores: JSONL vs PostgreSQL", "",
        f"`.venv/bin/python bench/bench_stores.py --sessions {args.sessions} --calls {args.calls}"
        f" --rounds {args.rounds}` ({total} `persist_call`s per run, {CONCURRENCY} sessions at"
        " a time, PostgreSQL on loopback; medians of the rounds)", "",
        "| store | calls/s | µs/call | time vs floor | bytes/call |", "|---|---|---|---|---|",
    ]
    for name in runners:
        took = statistics.median(seconds[name])
        per_call = statistics.median(sizes[name]) / total
        lines.append(f"| {name} | {total / took:,.0f} | {took / total * 1e6:.0f} | "
                     f"{took / floor:.1f} | {per_call:.0f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "stores.md").write_text(report)


if __name__ == "__main__":
    asyncio.run(main())
