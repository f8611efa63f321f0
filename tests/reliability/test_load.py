"""Load through the web channel: 1,000 concurrent conversations, order kept, nothing lost,
bounded memory per idle conversation; and a soak (60 s in ``make test``, 10 minutes in
``make soak``: ``GATEWAY_SOAK_SECONDS``).

The provider is instant (:class:`~tests.reliability.support.EchoProvider` answers
``echo: <text>``), so the gateway itself is what is exercised. Nothing here is timed: speed
is ``bench/bench_load.py``'s to report, and a machine busy with other work must not change the
verdict. So the session-write bound (``GATEWAY_PERSIST_TIMEOUT``) is a minute here: on a
loaded 2-core machine a 2 s bound trips while hundreds of conversations share the disk (each
trip counted as a persist failure, which these tests assert is zero); what they prove is order
and completeness, and a write that really failed is still counted, whatever its bound.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path

import psutil
import pytest

from sessions.replay import replay_bytes
from tests.reliability.support import (
    EchoProvider,
    idle_memory_per_conversation,
    message_text,
    run_load,
    session_files,
    settle,
    total,
    web_gateway,
    web_settings,
)
from tests.web_ids import client_label

CONVERSATIONS = 1_000
MESSAGES = 3
IDLE_CEILING = 64 * 1024
PERSIST_TIMEOUT = 60
"""Seconds a session write may take before it counts as failed (see the module docstring)."""


async def test_thousand_concurrent_conversations_keep_order_and_lose_nothing(
    tmp_path: Path,
) -> None:
    """1,000 conversations x 3 messages at once: every reply and log in order, none lost."""
    # Timeouts have their own tests (tests/reliability/test_faults.py).
    settings = web_settings(tmp_path / "data", GATEWAY_PERSIST_TIMEOUT=PERSIST_TIMEOUT)
    async with web_gateway(settings, provider=EchoProvider(), connections=100) as web:
        result = await run_load(web, CONVERSATIONS, MESSAGES)
        await settle(web, CONVERSATIONS * MESSAGES)
        samples = await web.metrics()
        registry = web.gateway.registry
        open_now, weight = len(registry), registry.open_bytes
    expected = {c: [(200, f"echo: {message_text(c, n)}") for n in range(MESSAGES)]
                for c in result.replies}
    assert len(expected) == CONVERSATIONS
    assert result.replies == expected
    assert total(samples, "gateway_turns_total", outcome="answered") == CONVERSATIONS * MESSAGES
    assert total(samples, "gateway_persist_failures_total") == 0
    assert registry.max_open is not None  # JSONL: a descriptor each
    assert open_now <= registry.max_open
    assert weight <= registry.max_bytes
    logs = {}
    for path in session_files(tmp_path / "data"):
        replay = replay_bytes(path.read_bytes())
        assert replay.problems == ()
        assert not replay.torn_tail
        logs[client_label(replay.header["conversation"])] = [
            (m["role"], m["content"] if isinstance(m["content"], str) else m["content"][0]["text"])
            for m in replay.messages]
    assert len(logs) == CONVERSATIONS
    for conversation, session in result.sessions.items():
        assert session is not None
        messages = logs[f"web:{conversation}"]
        assert messages == [pair for n in range(MESSAGES) for pair in (
            ("user", message_text(conversation, n)),
            ("assistant", f"echo: {message_text(conversation, n)}"))]


async def test_more_concurrent_conversations_than_open_sessions_lose_nothing(
    tmp_path: Path,
) -> None:
    """More conversations talking than open sessions allowed: no message lost to an early close."""
    # This used to fail: a session closed between recording a message and starting its turn
    # (CLOSED writes, then IndexError turns).
    settings = web_settings(tmp_path / "data", GATEWAY_MAX_OPEN_SESSIONS=4,
                            GATEWAY_PERSIST_TIMEOUT=PERSIST_TIMEOUT)
    async with web_gateway(settings, provider=EchoProvider(), connections=200) as web:
        result = await run_load(web, 200, MESSAGES)
        await settle(web, 200 * MESSAGES)
        samples = await web.metrics()
    assert result.replies == {c: [(200, f"echo: {message_text(c, n)}") for n in range(MESSAGES)]
                              for c in result.replies}
    assert total(samples, "gateway_persist_failures_total") == 0
    for path in session_files(tmp_path / "data"):
        replay = replay_bytes(path.read_bytes())
        assert replay.problems == ()
        assert [m["role"] for m in replay.messages] == ["user", "assistant"] * MESSAGES


@pytest.mark.parametrize("keep_open", [True, False], ids=["open-idle", "closed-idle"])
async def test_idle_conversation_memory_is_bounded(tmp_path: Path, keep_open: bool) -> None:
    """An idle conversation, open or closed, costs under 64 KB (bench/bench_load.py has figures)."""
    memory = await idle_memory_per_conversation(tmp_path, 300, keep_open=keep_open)
    assert 0 < memory.traced < IDLE_CEILING
    assert memory.rss < 4 * IDLE_CEILING  # RSS moves in allocator arenas: a coarse check only


SOAK_SECONDS = float(os.environ.get("GATEWAY_SOAK_SECONDS") or 60)
SOAK_POOL = 100
SOAK_ROTATE = 10  # messages per session before "/new" starts a fresh one
SOAK_PACE = 0.5  # seconds between one conversation's messages: steady traffic, not a flood
SAMPLE_EVERY = 2.0  # seconds between memory samples


@pytest.mark.timeout(SOAK_SECONDS + 300)  # the traffic, plus start and stop on a busy machine
async def test_soak_memory_stays_flat(tmp_path: Path) -> None:
    """Steady traffic with rotating sessions (60 s here, ten minutes in ``make soak``): it
    never stalls, and the RSS trend over the steady phase stays under 8 MB."""
    settings = web_settings(tmp_path / "data", GATEWAY_DURABILITY="none",
                            GATEWAY_PERSIST_TIMEOUT=PERSIST_TIMEOUT)
    process = psutil.Process()
    samples: list[tuple[float, int, float]] = []  # (time, RSS, turns so far)
    stop = time.monotonic() + SOAK_SECONDS
    async with web_gateway(settings, provider=EchoProvider(), connections=50) as web:

        def turns_now() -> float:
            return sum(s.value for f in web.gateway.metrics.registry.collect()
                       for s in f.samples if s.name == "gateway_turns_total")

        async def conversation(name: str) -> None:
            n = 0
            while time.monotonic() < stop:
                n += 1
                text = "/new" if n % (SOAK_ROTATE + 1) == 0 else f"{name} says {n}"
                status, _ = await web.chat(name, text)
                assert status == 200
                await asyncio.sleep(SOAK_PACE)  # pacing the load, not waiting for anything

        async def sample() -> None:
            while time.monotonic() < stop:
                samples.append((time.monotonic(), process.memory_info().rss, turns_now()))
                await asyncio.sleep(SAMPLE_EVERY)  # a sampling period, not a wait

        async with asyncio.TaskGroup() as group:
            group.create_task(sample())
            for c in range(SOAK_POOL):
                group.create_task(conversation(f"soak-{c:03d}"))
        samples_metrics = await web.metrics()
    steady = samples[len(samples) // 5:]
    xs = [t - steady[0][0] for t, _, _ in steady]
    ys = [float(rss) for _, rss, _ in steady]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs)
    growth = slope * (xs[-1] - xs[0])
    turns = total(samples_metrics, "gateway_turns_total")
    print(f"soak: {turns:.0f} turns in {SOAK_SECONDS:.0f} s; RSS {ys[0] / 1e6:.1f} -> "
          f"{ys[-1] / 1e6:.1f} MB, trend {growth / 1e6:+.2f} MB over the steady phase")
    # Traffic flowed all along: turns were answered in every quarter of the steady phase
    # (a count, not a rate: a busy machine answers fewer, never none).
    quarters = [steady[len(steady) * q // 4][2] for q in range(4)] + [turns]
    assert all(b > a for a, b in itertools.pairwise(quarters)), quarters
    assert growth < 8 * 1024 * 1024, f"RSS grew {growth / 1e6:.1f} MB over the steady phase"
    assert total(samples_metrics, "gateway_persist_failures_total") == 0
