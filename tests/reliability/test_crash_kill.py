"""Crash-kill trials: `gateway run` SIGKILLed at random moments and restarted on its data dir.

Each trial starts the gateway (a subprocess; Telegram long polling, Slack Events API over HTTP
and web, against the fakes in this process; the fake Anthropic API answers after a random
delay), drives several Telegram chats and Slack DMs and threads at once, and kills it: during a
burst (mid-append), while the fake provider holds a call (mid-call), or during steady traffic;
or stops it cleanly (SIGTERM) under traffic, since messages arriving while it drains must be
left to the platform too.
After each kill, and after a final clean run, the data dir must hold:

* only session files that replay without problems (a torn final line is the one thing allowed,
  and the next run must leave the earlier entries intact and cut the tail before appending);
* every message the platform saw acknowledged (Slack: a delivery answered 200; Telegram: an
  update below the confirmed offset), found by platform id and text;

and no message may be answered twice (the bot's messages as they stand, previews edited into
finals counting once). ``GATEWAY_CRASH_TRIALS=N`` runs N trials (default 3, bounded to about
a minute); ``GATEWAY_CRASH_SEED`` replays a run. The summary goes to the test output and to
``test-output/crash-kill.txt``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.providers import FakeProviderServer
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer
from tests.reliability.crash_harness import (
    SLACK_DM_USERS,
    TG_USERS,
    GatewayProcess,
    SlowEcho,
    Traffic,
    answered,
    check_logs,
    check_prefixes,
    free_port,
    gateway_env,
    missing,
)

DEFAULT_TRIALS = 3
DEFAULT_BUDGET = 30.0
"""Seconds after which the default run starts no new trial (the final run still follows)."""
MODES = ("burst", "mid-call", "steady", "stop")
REPORT = Path(__file__).resolve().parents[2] / "test-output" / "crash-kill.txt"


@dataclass
class Trial:
    """One run of the gateway, ended by a kill (or a clean stop), and what the checks found."""

    number: int
    mode: str
    ended_after: float
    sent: int
    findings: list[str] = field(default_factory=list)

    def line(self) -> str:
        outcome = "ok" if not self.findings else "; ".join(self.findings[:5])
        how = "stopped" if self.mode == "stop" else "killed"
        return (f"trial {self.number}: {self.mode}, {how} after {self.ended_after:.2f} s, "
                f"{self.sent} messages sent: {outcome}")


class Driver:
    """Sends traffic while the gateway runs; the Slack deliveries are tasks so a kill never
    waits on them."""

    def __init__(self, traffic: Traffic, gateway: GatewayProcess, rng: random.Random) -> None:
        self.traffic = traffic
        self.gateway = gateway
        self.rng = rng
        self.sent = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return self.gateway.base + "/slack/events"

    def one(self) -> None:
        self.sent += 1
        if self.rng.random() < 0.5:
            self.traffic.telegram_message()
        else:
            self._spawn(self.traffic.deliver(self.url, self.traffic.slack_message()))

    def retry_unacked(self) -> None:
        """What Slack does for events it got no 200 for: deliver them again."""
        for message in self.traffic.unacked_slack:
            self._spawn(self.traffic.deliver(self.url, message, retry=True))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def steady(self) -> None:
        while True:
            self.one()
            await asyncio.sleep(self.rng.uniform(0.02, 0.12))

    async def settled(self) -> None:
        while self._tasks:
            await asyncio.wait(list(self._tasks))


async def run_until_kill(driver: Driver, echo: SlowEcho, rng: random.Random,
                         mode: str) -> tuple[float, list[str]]:
    """Traffic in ``mode`` until the kill (or stop); returns seconds from the start of traffic
    and what went wrong with the stop itself."""
    started = time.monotonic()
    findings: list[str] = []
    driver.retry_unacked()
    steady = asyncio.create_task(driver.steady())
    try:
        if mode == "burst":
            await asyncio.sleep(rng.uniform(0.1, 0.6))
            for _ in range(12):
                driver.one()
            await asyncio.sleep(rng.uniform(0.0, 0.15))
        elif mode == "mid-call":
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            async with asyncio.timeout(10):
                while not echo.holding:  # noqa: ASYNC110 - the fake has no notification
                    await asyncio.sleep(0.005)
            await asyncio.sleep(rng.uniform(0.0, 0.03))
        elif mode == "stop":
            # A clean stop under traffic: the router stops taking input first, so whatever
            # arrives during the drain must be left to the platform, not dropped.
            await asyncio.sleep(rng.uniform(0.3, 1.0))
            code = await driver.gateway.stop()
            if code != 0:
                findings.append(f"clean stop under traffic exited with {code}")
        else:
            await asyncio.sleep(rng.uniform(0.3, 1.5))
        await driver.gateway.kill()
    finally:
        steady.cancel()
        await asyncio.wait([steady])  # waits for the cancel without swallowing our own
    killed_after = time.monotonic() - started
    await driver.settled()
    return killed_after, findings


async def final_run(driver: Driver, tg: FakeTelegramServer, slack: FakeSlackServer) -> list[str]:
    """A last run with no kill: Slack's redeliveries, then one message in every conversation
    (so every session is reopened and a torn tail repaired), all answered; then a clean stop."""
    traffic = driver.traffic
    for _ in range(5):
        driver.retry_unacked()
        await driver.settled()
        if not traffic.unacked_slack:
            break
    tokens = [traffic.telegram_message(user) for user in TG_USERS]
    last = [traffic.slack_dm(user) for user in SLACK_DM_USERS]
    last += [traffic.slack_mention(thread) for thread in list(traffic.threads)]
    tokens += [message.token for message in last]
    for message in last:
        await traffic.deliver(driver.url, message)
    findings: list[str] = []
    try:
        async with asyncio.timeout(30):
            # Queues are served in order, so once the last messages are answered, whatever was
            # redelivered before them has been handled too.
            while (tg.confirmed_offset <= max(traffic.telegram) or traffic.unacked_slack  # noqa: ASYNC110
                   or not set(tokens) <= set(answered(tg, slack))):
                await asyncio.sleep(0.05)
    except TimeoutError:
        findings.append("final run did not settle within 30 s")
    await asyncio.sleep(0.5)  # anything answered twice would show by now
    code = await driver.gateway.stop()
    if code != 0:
        findings.append(f"clean stop exited with {code}")
    return findings


async def test_crash_kill_trials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILLed at random moments, the gateway loses no acknowledged message, answers none
    twice, and leaves only replayable session logs."""
    explicit = os.environ.get("GATEWAY_CRASH_TRIALS")
    trials = int(explicit) if explicit else DEFAULT_TRIALS
    budget = None if explicit else DEFAULT_BUDGET
    seed = int(os.environ.get("GATEWAY_CRASH_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    results: list[Trial] = []
    final: list[str] = []
    started = time.monotonic()
    async with FakeTelegramServer() as tg, FakeSlackServer() as slack, \
            FakeProviderServer() as llm:
        echo = SlowEcho(rng)
        llm.default = echo
        traffic = Traffic(tg, slack, rng)
        port = free_port()
        gateway = GatewayProcess(gateway_env(data_dir, port, tg, slack, llm), cwd=tmp_path,
                                 log_dir=tmp_path, port=port)
        driver = Driver(traffic, gateway, rng)
        before: dict[Path, bytes] = {}
        reported: set[str] = set()
        torn_seen = 0
        try:
            for number in range(1, trials + 1):
                if budget is not None and time.monotonic() - started > budget:
                    break
                await gateway.start()
                sent = driver.sent
                mode = rng.choice(MODES)
                killed_after, found = await run_until_kill(driver, echo, rng, mode)
                logs = check_logs(data_dir)
                torn_seen += len(logs.torn)
                trial = Trial(number, mode, killed_after, driver.sent - sent)
                found += check_prefixes(before, logs.files) + logs.problems
                found += [f"lost {m}" for m in missing(traffic.acknowledged(), logs)]
                found += [f"{t} answered {n} times"
                          for t, n in answered(tg, slack).items() if n > 1]
                trial.findings = [f for f in found if f not in reported]  # new ones only
                reported.update(found)
                results.append(trial)
                before = logs.files
            await gateway.start()
            final = await final_run(driver, tg, slack)
        finally:
            await gateway.kill()
        logs = check_logs(data_dir)
        final += check_prefixes(before, logs.files) + logs.problems
        final += [f"torn tail left in {p.name}" for p in logs.torn]
        final += [f"lost {m}" for m in missing(traffic.acknowledged(), logs)]
        counts = answered(tg, slack)
        final += [f"{t} answered {n} times" for t, n in counts.items() if n > 1]

    acked = traffic.acknowledged()
    modes = Counter(t.mode for t in results)
    failed = [t for t in results if t.findings]
    summary = (
        f"crash-kill: {len(results)} trials ({', '.join(f'{m} {n}' for m, n in modes.items())})"
        f" + a final clean run, seed {seed}, {time.monotonic() - started:.1f} s: "
        f"{driver.sent} messages sent, {len(acked)} acknowledged, "
        f"{sum(1 for t in acked.values() if t in counts)} of those answered, "
        f"{sum(n > 1 for n in counts.values())} answered twice, {torn_seen} torn tails seen; "
        f"{len(failed)} trials with findings, final run "
        f"{'ok' if not final else 'FAILED: ' + '; '.join(final[:5])}"
    )
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text("\n".join([*(t.line() for t in results), summary]) + "\n")
    with capsys.disabled():
        print(f"\n{summary}")
    problems = [f"trial {t.number}: {f}" for t in failed for f in t.findings] + final
    if problems:
        pytest.fail(f"{summary}\nlogs in {tmp_path}\n" + "\n".join(problems[:40]))
