"""Benchmark: what the persist step (recording each call before it is made) adds to a turn.

A turn through the real router, agent loop and JSONL store, with an instant in-process
provider (``ScriptedProvider``) and a fixed 8 KB system prompt, is timed with the step on
(the gateway's recorder) and off (a recorder that records nothing, for this floor only),
alternating in the same run. Target: the step adds <= 5 %. Reported twice: wall-clock
time per turn (what a user waits, but on a shared machine mostly a measure of its load), and
process CPU time per turn, every thread included (the work the step adds, which load does not
inflate).

Run: .venv/bin/python bench/bench_turn.py [--turns 300] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordination.local import LocalConversations
from gateway.agent.loop import AgentLoop
from gateway.agent.prompt import BuiltPrompt
from gateway.agent.recorder import SESSION_LOG, CallRecorder, PersistResult, SessionRecorder
from gateway.agent.tools import ToolRegistry
from gateway.delivery.registry import ConversationRegistry
from gateway.delivery.router import Router
from gateway.edge.messages import ChannelContext
from gateway.edge.metrics import Metrics
from sessions.jsonl import JsonlSessionStore
from sessions.records import CallRequest, Prompt, Section
from sessions.store import Durability
from tests.fakes.memory_channel import MemoryChannel
from tests.fakes.scripted_provider import ScriptedProvider


class FixedPrompt:
    """An 8 KB prompt in seven sections, built once (as the persona cache does)."""

    def __init__(self) -> None:
        names = ["soul", "user", "memory", "skills", "mood", "kb", "channel"]
        chunk = 8192 // len(names)
        self.built = BuiltPrompt(
            Prompt.from_sections([Section(n, (n + " ") * (chunk // (len(n) + 1))) for n in names]),
            "initial",
        )

    async def build(self, context: ChannelContext) -> BuiltPrompt:
        return self.built


class NotRecording:
    """The floor: a persist step that records nothing (the gateway has no such recorder)."""

    async def record_call(self, session: SessionRecorder, request: CallRequest
                          ) -> PersistResult:
        return PersistResult(recorded=False)


async def run_turns(record: bool, turns: int, durability: Durability) -> tuple[float, float]:
    """For ``turns`` sequential turns in one conversation: the median wall-clock seconds per
    turn, and the process CPU seconds per turn (every thread: the disk lane's writes count),
    both after the first 10 % (warm-up)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Metrics()
        recorder: CallRecorder = SESSION_LOG if record else NotRecording()
        loop = AgentLoop(provider=ScriptedProvider(keep_bodies=False), prompts=FixedPrompt(),
                         tools=ToolRegistry(), recorder=recorder, metrics=metrics)
        registry = ConversationRegistry(JsonlSessionStore(Path(tmp), durability=durability),
                                        metrics)
        channel = MemoryChannel()
        times: list[float] = []
        queue = LocalConversations()
        await queue.open()
        cpu_start = 0.0
        async with Router(registry=registry, loop=loop, sink_for=channel.reply_sink,
                          metrics=metrics, conversations=queue) as router:
            await channel.start(router.deliver)
            for i in range(turns):
                if i == turns // 10:
                    cpu_start = time.process_time()
                started = time.perf_counter()
                await channel.say("bench", f"message {i}")
                await channel.wait_replies(i + 1)
                times.append(time.perf_counter() - started)
            cpu = (time.process_time() - cpu_start) / (turns - turns // 10)
            await router.drain(5)
        await registry.aclose()
        await queue.aclose()
        return statistics.median(times[turns // 10:]), cpu


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = ["## Turn: persist step on vs off", "",
             f"`.venv/bin/python bench/bench_turn.py --turns {args.turns} --rounds {args.rounds}`"
             f" ({datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit {commit()},"
             f" load average {load} at start)", "",
             "| durability | measure | step off (median of rounds) | step on | ratio | target |",
             "|---|---|---|---|---|---|"]
    for durability in ("none", "turn"):
        off: list[tuple[float, float]] = []
        on: list[tuple[float, float]] = []
        for _ in range(args.rounds):  # alternate so drift in machine load hits both sides
            off.append(await run_turns(False, args.turns, durability))
            on.append(await run_turns(True, args.turns, durability))
        for column, name in ((0, "wall µs/turn"), (1, "CPU µs/turn")):
            m_off = statistics.median(r[column] for r in off)
            m_on = statistics.median(r[column] for r in on)
            ratio = m_on / m_off
            verdict = "met" if ratio <= 1.05 else f"missed by {(ratio - 1.05) * 100:.1f} points"
            lines.append(f"| {durability} | {name} | {m_off * 1e6:.0f} | {m_on * 1e6:.0f} | "
                         f"{ratio:.3f} | <= 1.05 ({verdict}) |")
    lines.append(f"\nLoad average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} at the end.")
    report = "\n".join(lines) + "\n"
    print(report)
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "turn.md").write_text(report)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    asyncio.run(main())
