"""Benchmark: crash-kill trials at random protocol steps, and the window a kill can still hit.

**Trials.** The trials of ``tests/reliability/test_crash_kill.py::test_kills_at_random_steps``
(:mod:`tests.reliability.crash_trials`), ``--trials`` of them (200 for bench/RESULTS.md), in
batches of ``--batch`` (each batch a fresh data directory and a final clean run, as in CI):
`gateway run` with Telegram (polling or webhook), Slack (HTTP or Socket Mode) and web, killed
at a reply event drawn uniformly over each burst (before or after its call; a tenth of them a
SIGTERM instead). Reported: acknowledged messages by channel, how many have exactly one
complete answer on their platform and in the log, twice, never, lost, and the stray messages
(placeholders, partial previews) kills left. Every batch's schedule is printed, so any trial
replays (``GATEWAY_TRIAL_SCHEDULE``).

**The window.** A clean run answers ``--messages`` Telegram and Slack messages, then reads
``gateway_reply_note_seconds`` from ``/metrics``: the time from a platform returning the id of
a message that will carry an answer to that id being in the session log. A kill inside it
leaves a stray placeholder (Telegram: no way to find the message again; Slack finds it by its
metadata). Reported per channel: count, mean, and the share under each bucket bound.

Run: .venv/bin/python bench/bench_delivery.py [--trials 200] [--batch 20] [--messages 100]
     [--seed N] [--skip-trials] [--skip-window]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.providers import FakeProviderServer  # noqa: E402 - after the path set-up
from tests.fakes.slack_api import FakeSlackServer  # noqa: E402
from tests.fakes.telegram_api import FakeTelegramServer  # noqa: E402
from tests.ports import free_port  # noqa: E402
from tests.reliability.crash_harness import (  # noqa: E402
    SLACK_DM_USERS,
    TG_USERS,
    GatewayProcess,
    SlowEcho,
    Traffic,
    answered,
    gateway_env,
    slack_input,
    telegram_input,
)
from tests.reliability.crash_schedule import random_plans  # noqa: E402
from tests.reliability.crash_trials import BURST, Summary, run_schedule  # noqa: E402

EVENTS = 3 * BURST
SAMPLE = re.compile(r'^gateway_reply_note_seconds_(bucket|sum|count)\{(.*?)\} (\S+)$')


async def trials(count: int, batch: int, seed: int) -> list[Summary]:
    rng = random.Random(seed)
    summaries = []
    for number in range(0, count, batch):
        size = min(batch, count - number)
        plans = random_plans(rng, size, EVENTS, stops=max(1, size // 10))
        with tempfile.TemporaryDirectory(prefix="bench-delivery-") as tmp:
            summary = await run_schedule(f"bench-delivery-{number // batch + 1}", plans,
                                         Path(tmp), test="crash-random")
        print(summary.line(), flush=True)
        summaries.append(summary)
    return summaries


def trial_report(summaries: list[Summary], seconds: float) -> str:
    total = Counter[str]()
    channels = Counter[str]()
    stray = Counter[str]()
    findings = 0
    for s in summaries:
        for column in ("acknowledged", "once", "twice", "never", "recorded", "lost"):
            total[column] += s.total(column)
        channels.update(s.by_channel)
        stray.update(s.strays)
        findings += len(s.with_findings) + (1 if s.final else 0)
    kinds = Counter[str]()
    for s in summaries:
        kinds.update(r.plan.label.split(" at ")[0] if r.plan.kill.startswith("stop")
                     else f"SIGKILL ({r.plan.kill.rsplit(':', 1)[1]} its call)"
                     for r in s.results)
    trials_run = sum(len(s.results) for s in summaries)
    lines = [
        f"{trials_run} trials in {len(summaries)} batches, {seconds:.0f} s "
        f"({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))}); "
        f"acknowledged {total['acknowledged']} "
        f"({', '.join(f'{c} {n}' for c, n in channels.items())}); answered once "
        f"{total['once']}, twice {total['twice']}, never {total['never']}; recorded "
        f"{total['recorded']}, lost {total['lost']}; stray messages "
        f"{dict(stray) or 'none'}; batches or trials with findings: {findings}",
        "",
        "| trials | acknowledged | answered once | answered twice | never answered | "
        "lost | stray placeholders | stray partial previews |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {trials_run} | {total['acknowledged']} | {total['once']} | {total['twice']} | "
        f"{total['never']} | {total['lost']} | {stray['placeholder']} | {stray['partial']} |",
        "",
        "By the input each message was first sent through (stray messages: by the input "
        "whose run sent them):",
        "",
        "| input | trials | acknowledged | answered once | answered twice | never answered | "
        "lost | stray placeholders | stray partial previews |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *_input_rows(summaries),
        "",
        "Schedules (replay any batch with GATEWAY_TRIAL_SCHEDULE='crash-random=...'):",
        *(f"- {s.name}: {s.schedule}" for s in summaries),
    ]
    return "\n".join(lines)


def _input_rows(summaries: list[Summary]) -> list[str]:
    rows: dict[str, Counter[str]] = {}
    for s in summaries:
        for row in s.inputs:
            cells = rows.setdefault(row.kind, Counter())
            for column in ("trials", "acknowledged", "once", "twice", "never", "lost"):
                cells[column] += getattr(row, column)
        for name, kinds in s.strays_by_input.items():
            rows.setdefault(name, Counter()).update(kinds)
    return [f"| {name} | {c['trials']} | {c['acknowledged']} | {c['once']} | {c['twice']} | "
            f"{c['never']} | {c['lost']} | {c['placeholder']} | {c['partial']} |"
            for name, c in rows.items()]


async def window(messages: int) -> str:
    """A clean run of ``messages`` Telegram and Slack messages; the note histogram."""
    with tempfile.TemporaryDirectory(prefix="bench-window-") as tmp:
        data_dir = Path(tmp) / "data"
        async with FakeTelegramServer() as tg, FakeSlackServer() as slack, \
                FakeProviderServer() as llm, aiohttp.ClientSession() as http:
            llm.default = SlowEcho(random.Random(1), low=0.0, high=0.02)
            traffic = Traffic(tg, slack, random.Random(2))
            port = free_port()
            gateway = GatewayProcess(gateway_env(data_dir, port, tg, slack, llm),
                                     cwd=Path(tmp), log_dir=Path(tmp), port=port)
            await telegram_input(gateway, tg, "polling")
            slack_input(gateway, traffic, "http")
            await gateway.start()
            try:
                url = gateway.base + "/slack/events"
                tokens = []
                for i in range(messages):
                    tokens.append(traffic.telegram_message(TG_USERS[i % len(TG_USERS)]))
                    message = traffic.slack_dm(SLACK_DM_USERS[i % len(SLACK_DM_USERS)])
                    await traffic.deliver(url, message)
                    tokens.append(message.token)
                    await asyncio.sleep(0.02)
                async with asyncio.timeout(300):
                    while not set(tokens) <= set(answered(tg, slack)):  # noqa: ASYNC110
                        await asyncio.sleep(0.1)
                async with http.get(gateway.base + "/metrics") as response:
                    text = await response.text()
            finally:
                await gateway.stop()
    return window_report(text)


def window_report(metrics: str) -> str:
    buckets: dict[str, list[tuple[float, float]]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in metrics.splitlines():
        match = SAMPLE.match(line)
        if match is None:
            continue
        kind, labels, value = match.groups()
        channel = re.search(r'channel="([^"]+)"', labels)
        name = channel.group(1) if channel else "?"
        if kind == "bucket":
            bound = re.search(r'le="([^"]+)"', labels)
            if bound is not None and bound.group(1) != "+Inf":
                buckets.setdefault(name, []).append((float(bound.group(1)), float(value)))
        elif kind == "sum":
            sums[name] = float(value)
        else:
            counts[name] = float(value)
    lines = ["| channel | notes | mean | <= 0.5 ms | <= 1 ms | <= 2 ms | <= 5 ms | <= 10 ms | "
             "<= 50 ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in sorted(counts):
        n = counts[name]
        if not n:
            continue
        share = {bound: cumulative / n for bound, cumulative in buckets.get(name, [])}
        cells = [f"{share.get(b, 0.0) * 100:.0f} %" for b in (0.0005, 0.001, 0.002, 0.005,
                                                               0.01, 0.05)]
        lines.append(f"| {name} | {n:.0f} | {sums[name] / n * 1000:.2f} ms | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--skip-trials", action="store_true")
    parser.add_argument("--skip-window", action="store_true")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    out = [f"bench_delivery: seed {seed}, load average {os.getloadavg()[0]:.1f} at the start"]
    if not args.skip_window:
        out += ["", "Window (gateway_reply_note_seconds):", await window(args.messages)]
        print("\n".join(out), flush=True)
    if not args.skip_trials:
        started = time.monotonic()
        summaries = await trials(args.trials, args.batch, seed)
        out += ["", trial_report(summaries, time.monotonic() - started)]
    out.append(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    report = "\n".join(out)
    print(report)
    (ROOT / "bench" / "out").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "out" / "delivery.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
