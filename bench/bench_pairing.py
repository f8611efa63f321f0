"""Benchmark: 1,000 DMs from unknown Telegram users must not block the gateway.

Each stranger's DM makes access control issue a pairing code. The subject is a gateway built
by ``app.compose.build_gateway`` as ``gateway run`` builds it, in its own process: Telegram in
webhook mode against the fake Bot API (``tests/fakes/telegram_api.py``, in this process), pairing
on, the JSONL store in a temporary directory, INFO logging to a file.

Per round, on a fresh data directory: ``/healthz`` is asked 200 times in a row on the idle
gateway, then 1,000 webhook POSTs, each a DM from a new user, go out 50 in flight while
``/healthz`` is asked in a loop until they are done. Each round runs twice, alternating:

* subject: pairing on (every stranger gets a code, written to the pairing file, and a notice);
* floor: ``GATEWAY_PAIRING=false`` (strangers are refused silently): the same webhook path
  (secret, parse, dedup, access control) without pairing or notices.

Reported (medians over rounds): webhook latency p50/p99, ``/healthz`` p50, p99 and max under
load, the ratio of ``/healthz`` p50 under load to idle, the pairing file's size and pending
codes. Targets: subject ``/healthz`` p99 under load <= 50 ms and <= 2x the floor's.

Run: .venv/bin/python bench/bench_pairing.py [--rounds 3] [--strangers 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.compose import build_gateway
from app.config import Settings
from bench._harness import Child, machine_line, percentile, serve_forever, write_report
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer

SECRET = "bench-secret"
IN_FLIGHT = 50


async def timed_get(http: aiohttp.ClientSession, url: str) -> float:
    started = time.perf_counter()
    async with http.get(url) as response:
        await response.read()
    return time.perf_counter() - started


async def one_round(strangers: int, pairing: bool, index: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        async with FakeTelegramServer() as fake:
            config = {"data_dir": tmp, "token": fake.token, "base_url": fake.base_url,
                      "pairing": pairing}
            log = Path(tempfile.gettempdir()) / f"bench_pairing_{index}_{pairing}.log"
            async with Child(Path(__file__), "gateway", config, log) as child:
                base = f"http://127.0.0.1:{child.info['port']}"
                measured = await load(fake, base, strangers)
            path = data_dir / "access" / "pairing.json"
            pending = len(orjson.loads(path.read_bytes()).get("pending", {})) if pairing else 0
            return {**measured, "pairing_kb": path.stat().st_size / 1024 if pairing else 0.0,
                    "pending": pending}


async def load(fake: FakeTelegramServer, base: str, strangers: int) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=IN_FLIGHT + 5)
    async with aiohttp.ClientSession(connector=connector) as http:
        # One DM first: the dedup file is opened on first use, and concurrent first uses
        # race (a FileDeduplicator bug reported to its owners).
        warm = fake.user_message(9_999, "warm-up")
        fake.pending_updates.clear()
        await fake.deliver_webhook(base + "/telegram/webhook", warm, secret=SECRET)
        idle = [await timed_get(http, base + "/healthz") for _ in range(200)]
        hooks: list[float] = []
        busy: list[float] = []
        slots = asyncio.Semaphore(IN_FLIGHT)
        done = asyncio.Event()

        async def stranger(n: int) -> None:
            update = fake.user_message(10_000 + n, "hello?")
            fake.pending_updates.clear()
            async with slots:
                started = time.perf_counter()
                status, _ = await fake.deliver_webhook(
                    base + "/telegram/webhook", update, secret=SECRET, timeout=60)
                hooks.append(time.perf_counter() - started)
            assert status == 200, status

        async def poll() -> None:
            while not done.is_set():
                busy.append(await timed_get(http, base + "/healthz"))

        poller = asyncio.create_task(poll())
        try:
            async with asyncio.TaskGroup() as group:
                for n in range(strangers):
                    group.create_task(stranger(n))
        finally:
            done.set()
            await poller
    return {
        "webhook_p50_ms": percentile(hooks, 0.5) * 1000,
        "webhook_p99_ms": percentile(hooks, 0.99) * 1000,
        "healthz_idle_p50_ms": percentile(idle, 0.5) * 1000,
        "healthz_busy_p50_ms": percentile(busy, 0.5) * 1000,
        "healthz_busy_p99_ms": percentile(busy, 0.99) * 1000,
        "healthz_busy_max_ms": max(busy) * 1000,
        "healthz_ratio": percentile(busy, 0.5) / percentile(idle, 0.5),
    }


async def serve(stop: asyncio.Event, ready: Callable[[dict[str, Any]], None],
                config: dict[str, Any]) -> None:
    """The child: one gateway until SIGTERM."""
    values: dict[str, Any] = {
        "GATEWAY_DATA_DIR": config["data_dir"], "GATEWAY_PORT": 0,
        "GATEWAY_CHANNELS": "telegram", "GATEWAY_PROVIDER": "offline",
        "TELEGRAM_BOT_TOKEN": config["token"], "TELEGRAM_API_BASE_URL": config["base_url"],
        "TELEGRAM_RATE_LIMIT": "off", "TELEGRAM_MODE": "webhook",
        "TELEGRAM_WEBHOOK_SECRET": SECRET, "TELEGRAM_ALLOWED_USERS": "1",
        "GATEWAY_SHUTDOWN_GRACE": 1, "GATEWAY_PAIRING": config["pairing"],
    }
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    settings = Settings(_env_file=None, **values)  # type: ignore[call-arg]  # pydantic-settings
    gateway = build_gateway(settings, provider=ScriptedProvider())
    await gateway.start()
    try:
        ready({"port": gateway.bound_port})
        await stop.wait()
    finally:
        await gateway.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strangers", type=int, default=1000)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"subject": [], "floor": []}
    for _ in range(args.rounds):
        runs["subject"].append(await one_round(args.strangers, True, len(runs["subject"])))
        runs["floor"].append(await one_round(args.strangers, False, len(runs["floor"])))
    lines = [f"# Pairing under {args.strangers} strangers ({args.rounds} rounds)", "",
             machine_line(), "", "| measure | pairing on (subject) | pairing off (floor) |",
             "|---|---|---|"]

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    for key in runs["subject"][0]:
        cells = [f"{median(kind, key):.2f} ({', '.join(f'{r[key]:.1f}' for r in runs[kind])})"
                 for kind in ("subject", "floor")]
        lines.append(f"| {key} | {cells[0]} | {cells[1]} |")
    p99 = median("subject", "healthz_busy_p99_ms")
    tail = p99 / median("floor", "healthz_busy_p99_ms")
    ok = p99 <= 50 and tail <= 2
    lines += ["", f"Targets: /healthz p99 under load <= 50 ms ({p99:.1f} ms) and <= 2x the "
              f"floor's ({tail:.2f}x): {'pass' if ok else 'MISS'}"]
    report = "\n".join(lines) + "\n"
    print(report)
    write_report("pairing.md", report)


if __name__ == "__main__":
    if "--serve" in sys.argv:
        config = json.loads(sys.argv[sys.argv.index("--config") + 1])
        serve_forever(lambda stop, ready: serve(stop, ready, config))
    else:
        asyncio.run(main())
