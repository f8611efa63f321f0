"""Benchmark: 1,000 concurrent conversations through the web channel, and idle memory.

The load: 1,000 conversations at once, each sending 3 messages one after the other over HTTP
(aiohttp client, at most ``--connections`` requests in flight, admitted in FIFO order;
latency is timed from admission), answered by the real gateway
(router, agent loop, JSONL store at its default durability ``turn``) with an instant
in-process provider. The floor is a bare aiohttp server in the same process answering the same
requests with the same JSON and no gateway behind it; floor and gateway alternate within each
run, so machine load drifts onto both. Reported: messages/s and p50/p99 latency (medians over
runs) and the ratios to the floor.

Idle memory: bytes an idle conversation costs after its turn, over ``--idle`` new
conversations: open-idle (the registry keeps every session open) and closed-idle (the registry
keeps one open and closes the rest), by tracemalloc (Python allocations) and by RSS (psutil,
on a separate untraced pass). Target: <= 20 KB per idle conversation.

Client and server share one process and one event loop (so do floor and client): the ratios
compare like with like; the absolute rates are lower than a separate client would see.

Run: .venv/bin/python bench/bench_load.py [--conversations 1000] [--messages 3] [--runs 3]
     [--connections 100] [--idle 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.reliability.support import (  # noqa: E402 - after the path set-up above
    EchoProvider,
    LoadResult,
    idle_memory_per_conversation,
    run_load,
    settle,
    web_gateway,
    web_settings,
)

TARGET_IDLE = 20 * 1024


class Floor:
    """A bare aiohttp server answering ``POST /api/chat`` as the gateway does, instantly."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self.http = http
        self.base = base

    async def chat(self, conversation: str, text: str) -> tuple[int, dict[str, Any]]:
        async with self.http.post(self.base + "/api/chat",
                                  json={"conversation": conversation, "text": text}) as resp:
            return resp.status, await resp.json(loads=orjson.loads)


async def _floor_chat(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    return web.json_response({"session": "floor", "reply": f"echo: {body['text']}"},
                             dumps=lambda v: orjson.dumps(v).decode())


@asynccontextmanager
async def floor_server(connections: int) -> AsyncIterator[Floor]:
    app = web.Application(client_max_size=2 * 1024 * 1024)
    app.router.add_post("/api/chat", _floor_chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=connections)) as http:
            yield Floor(http, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class Figures:
    """Client-side figures of one load run."""

    rate: float  # messages per second
    p50: float  # seconds
    p99: float

    @classmethod
    def of(cls, result: LoadResult) -> Figures:
        ordered = sorted(result.latencies)
        return cls(result.messages / result.seconds, ordered[len(ordered) // 2],
                   ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))])


def check(result: LoadResult, conversations: int, messages: int) -> None:
    """A benchmark of wrong answers is worthless: every reply must answer its own message."""
    assert len(result.replies) == conversations
    for conversation, got in result.replies.items():
        assert got == [(200, f"echo: {conversation} says {n}") for n in range(messages)], got


SUBJECTS = ("floor", "gateway, durability none", "gateway, durability turn (default)")


async def run_once(args: argparse.Namespace, tmp: Path, index: int) -> list[Figures]:
    """One run: the floor, then the gateway at durability ``none`` and ``turn``."""
    async with floor_server(args.connections) as floor:
        result = await run_load(floor, args.conversations, args.messages,
                                in_flight=args.connections)
    check(result, args.conversations, args.messages)
    figures = [Figures.of(result)]
    for durability in ("none", "turn"):
        settings = web_settings(tmp / f"run{index}-{durability}", GATEWAY_DURABILITY=durability)
        async with web_gateway(settings, provider=EchoProvider(),
                               connections=args.connections) as gw:
            result = await run_load(gw, args.conversations, args.messages,
                                    in_flight=args.connections)
            await settle(gw, args.conversations * args.messages)
        check(result, args.conversations, args.messages)
        figures.append(Figures.of(result))
    return figures


async def idle_in_child(state: str, count: int) -> tuple[float, float]:
    """Idle memory measured in a fresh interpreter, so RSS is not absorbed by arenas freed
    by the load runs before it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--measure-idle", state, "--idle", str(count),
        stdout=asyncio.subprocess.PIPE, cwd=str(ROOT))
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"idle measurement ({state}) failed with {proc.returncode}")
    traced, rss = orjson.loads(out.splitlines()[-1])
    return float(traced), float(rss)


async def measure_idle(state: str, count: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        m = await idle_memory_per_conversation(Path(name), count, keep_open=state == "open")
    print(orjson.dumps([m.traced, m.rss]).decode())


def median(values: list[float]) -> float:
    return statistics.median(values)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--no-results", action="store_true",
                        help="do not append the Load section to bench/RESULTS.md")
    parser.add_argument("--measure-idle", choices=["open", "closed"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_idle:
        await measure_idle(args.measure_idle, args.idle)
        return
    runs: list[list[Figures]] = []
    memory: dict[str, list[tuple[float, float]]] = {"open-idle": [], "closed-idle": []}
    started = time.time()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for run in range(args.runs):
            runs.append(await run_once(args, tmp, run))
            print(f"run {run + 1}: " + "; ".join(
                f"{subject}: {f.rate:.0f} msg/s, p50 {f.p50 * 1000:.1f} ms, "
                f"p99 {f.p99 * 1000:.1f} ms" for subject, f in zip(SUBJECTS, runs[-1],
                                                                 strict=True)), flush=True)
            for label in memory:
                traced, rss = await idle_in_child(label.split("-")[0], args.idle)
                memory[label].append((traced, rss))
                print(f"run {run + 1}: {label} {traced:.0f} B traced, {rss:.0f} B RSS",
                      flush=True)
    report = render(args, runs, memory, time.time() - started)
    print(report)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "load.md").write_text(report)
    if not args.no_results:
        append_results(report)


def render(args: argparse.Namespace, runs: list[list[Figures]],
           memory: dict[str, list[tuple[float, float]]], seconds: float) -> str:
    command = (f"`.venv/bin/python bench/bench_load.py --conversations {args.conversations} "
               f"--messages {args.messages} --runs {args.runs} --connections {args.connections} "
               f"--idle {args.idle}`")
    med = [Figures(median([r[i].rate for r in runs]), median([r[i].p50 for r in runs]),
                   median([r[i].p99 for r in runs])) for i in range(len(SUBJECTS))]
    lines = [
        "## Load", "",
        f"Command: {command} ({seconds:.0f} s in all).", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end. "
        "The client shares the server's process and event loop (for the floor too), so the "
        "rates are lower than a separate client would see; the ratios compare like with like.",
        "",
        f"### (a) {args.conversations} concurrent conversations x {args.messages} messages "
        f"(at most {args.connections} requests in flight; medians of {args.runs} runs)", "",
        "Every reply was checked to answer its own message, in order; none was lost. The "
        "floor is a bare aiohttp handler answering the same requests with the same JSON.", "",
        "| subject | messages/s | p50 latency | p99 latency | throughput / floor "
        "| p50 / floor |",
        "|---|---|---|---|---|---|",
    ]
    for i, (subject, f) in enumerate(zip(SUBJECTS, med, strict=True)):
        # Ratios are medians of the per-run ratios (subject and floor of the same run).
        rate = median([r[i].rate / r[0].rate for r in runs])
        p50 = median([r[i].p50 / r[0].p50 for r in runs])
        lines.append(f"| {subject} | {f.rate:.0f} | {f.p50 * 1000:.1f} ms | "
                     f"{f.p99 * 1000:.1f} ms | {rate:.2f}x | {p50:.1f}x |")
    lines += [
        "",
        "Per run (messages/s): " + "; ".join(
            f"{subject}: {', '.join(f'{r[i].rate:.0f}' for r in runs)}"
            for i, subject in enumerate(SUBJECTS)) + ".", "",
        f"### (b) Memory per idle conversation ({args.idle} conversations, each measured in a "
        f"fresh process; medians of {args.runs} runs)", "",
        "| state | tracemalloc | RSS | target | result |",
        "|---|---|---|---|---|",
    ]
    for label, rows in memory.items():
        traced = median([t for t, _ in rows])
        rss = median([r for _, r in rows])
        verdict = "pass" if max(traced, rss) <= TARGET_IDLE else "**miss**"
        lines.append(f"| {label} | {traced / 1024:.1f} KB | {rss / 1024:.1f} KB | "
                     f"<= {TARGET_IDLE // 1024} KB | {verdict} |")
    lines += [
        "",
        "Open-idle: the registry keeps the session open (its writer and file descriptor, the "
        "messages in memory, the writer state). Closed-idle: the registry closed it; what is "
        "left is the store's index entry naming the conversation's latest session. RSS moves "
        "in allocator arenas, so it is coarser than tracemalloc.", "",
    ]
    return "\n".join(lines)


def append_results(report: str) -> None:
    """Replace (or add) the Load section of bench/RESULTS.md, re-read just before writing."""
    path = Path(__file__).parent / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    start = text.find("\n## Load\n")
    if start != -1:
        end = text.find("\n## ", start + 1)
        text = text[:start] + ("\n" + text[end + 1:] if end != -1 else "\n")
    path.write_text(text.rstrip("\n") + "\n\n" + report.rstrip("\n") + "\n")


if __name__ == "__main__":
    asyncio.run(main())
