"""Running a schedule of crash-kill trials (:mod:`tests.reliability.crash_schedule`) against
`gateway run` and the fakes, and what they found.

Each trial starts the gateway on the same data directory with the plan's inputs, lets the
platforms deliver again what they were not acknowledged, sends a burst of messages, and ends
at the plan's step: a SIGKILL from inside the fake that sees the step (or a SIGTERM). Then
the data directory is read: no acknowledged message lost, none with two complete answers on
its platform or in the log, every session log replayable. A last clean run answers
everything; then every acknowledged message must have exactly one complete answer on its
platform (web: in its 200) and in the log. Stray placeholders and partial previews (the
window no platform lets a gateway close: a message sent, its id not yet noted) are counted
apart and reported.

A run that finds anything keeps its data directory and the gateway's logs under
``test-output/failed-trials/`` and says where, with the schedule that replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from tests.fakes.providers import FakeProviderServer
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer
from tests.ports import free_port
from tests.reliability.crash_driver import (
    TABLE_HEAD,
    Driver,
    Row,
    final_run,
    repeated,
    tally,
    tally_inputs,
)
from tests.reliability.crash_harness import (
    GatewayProcess,
    Progress,
    SlowEcho,
    Traffic,
    answered,
    bot_message_keys,
    check_logs,
    check_prefixes,
    gateway_env,
    items_of_tokens,
    missing,
    owed_bodies,
    paid_items,
    slack_input,
    stray_kind,
    strays,
    telegram_input,
)
from tests.reliability.crash_schedule import KillSwitch, TrialPlan, encode

OUTPUT = Path(__file__).resolve().parents[2] / "test-output"
BURST = 8
"""Messages of one trial (after the platforms' redeliveries)."""
SETTLE = 30.0
"""Seconds a trial's traffic may go without a reply event while neither its kill came nor
its messages are all answered (a loaded machine answers slowly but steadily: the bound is on
progress, never on the whole)."""


@dataclass
class TrialResult:
    number: int
    plan: TrialPlan
    fired: str
    sent: int
    seconds: float
    findings: list[str] = field(default_factory=list)

    def line(self) -> str:
        outcome = "ok" if not self.findings else "; ".join(self.findings[:5])
        return (f"trial {self.number} [{self.plan.encode()}]: telegram {self.plan.telegram}, "
                f"slack {self.plan.slack}, {self.plan.label}: killed at {self.fired}; "
                f"{self.sent} messages sent, {self.seconds:.1f} s: {outcome}")


@dataclass
class Summary:
    """What a run found, as printed and as asserted."""

    name: str
    schedule: str
    results: list[TrialResult]
    rows: list[Row]
    by_channel: dict[str, int]
    strays: Counter[str]
    final: list[str]
    seconds: float
    inputs: list[Row] = field(default_factory=list)
    """The tally by the input each message was first sent through (``telegram polling``,
    ``telegram webhook``, ``slack http``, ``slack socket``, ``web``)."""
    strays_by_input: dict[str, Counter[str]] = field(default_factory=dict)
    """The stray messages by the input whose trial they were sent in."""
    kept: Path | None = None
    test: str = ""
    """The name the schedule replays under (``GATEWAY_TRIAL_SCHEDULE='<test>=...'``)."""

    def total(self, column: str) -> int:
        return sum(int(getattr(row, column)) for row in self.rows)

    @property
    def with_findings(self) -> list[TrialResult]:
        return [r for r in self.results if r.findings]

    def line(self) -> str:
        channels = ", ".join(f"{c} {n}" for c, n in self.by_channel.items())
        stray = ", ".join(f"{n} {k}" for k, n in sorted(self.strays.items())) or "none"
        return (
            f"{self.name}: {len(self.results)} trials + a final clean run, "
            f"{self.seconds:.1f} s: {self.total('acknowledged')} acknowledged ({channels}), "
            f"{self.total('once')} answered once, {self.total('twice')} answered twice, "
            f"{self.total('never')} never answered, {self.total('lost')} lost; stray messages "
            f"(no answer, left by kills): {stray}; {len(self.with_findings)} trials with "
            f"findings, final run {self._final()}"
        )

    def _strays_by_input(self) -> str:
        return ", ".join(f"{i}: " + ", ".join(f"{n} {k}" for k, n in sorted(c.items()))
                         for i, c in sorted(self.strays_by_input.items())) or "none"

    def _final(self) -> str:
        return "ok" if not self.final else "FAILED: " + "; ".join(self.final[:5])

    def report(self) -> str:
        lines = [f"replay with: GATEWAY_TRIAL_SCHEDULE='{self.test or self.name}="
                 f"{self.schedule}'",
                 *(r.line() for r in self.results), self.line(), "", TABLE_HEAD,
                 *(row.cells() for row in self.rows), "", "By input:", "",
                 TABLE_HEAD.replace("trial kind", "input"),
                 *(row.cells() for row in self.inputs),
                 f"stray messages by input: {self._strays_by_input()}"]
        if self.kept is not None:
            lines.append(f"\ndata directory and gateway logs kept in {self.kept}")
        return "\n".join(lines) + "\n"


def acknowledged_by_channel(traffic: Traffic) -> dict[str, int]:
    acked = traffic.acknowledged()
    counts = Counter(channel for channel, _ in acked)
    return {"telegram": counts["telegram"], "slack": counts["slack"], "web": counts["web"]}


async def _inputs(gateway: GatewayProcess, traffic: Traffic, telegram: str, slack: str) -> None:
    await telegram_input(gateway, traffic.tg, telegram)
    traffic.telegram_mode = telegram
    slack_input(gateway, traffic, slack)


async def _start(gateway: GatewayProcess, traffic: Traffic) -> None:
    await gateway.start()
    if traffic.slack_mode == "socket":  # its events go nowhere until the socket is up
        # As long as the gateway makes progress (connecting is slow at load 20, not stuck).
        assert gateway.proc is not None
        progress = Progress(gateway.proc.pid, gateway.log)
        while not traffic.slack.socket_connected.is_set():
            if progress.stalled() or not gateway.running:
                raise TimeoutError(f"no Socket Mode connection after {progress.seconds:.0f} s "
                                   f"(the gateway stalled or exited); see {gateway.log}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await traffic.slack.socket_connected.wait()


async def _settled(driver: Driver, tokens: list[str], data_dir: Path) -> None:
    """Until every message of the trial that was acknowledged is answered and noted (the
    end of its traffic, when the kill never came)."""
    traffic = driver.traffic
    tg, slack = traffic.tg, traffic.slack
    while True:
        await driver.settled()
        done = set(answered(tg, slack)) | {m.token for m in traffic.web_messages
                                           if m.reply is not None}
        acked = set(traffic.acknowledged().values())
        waiting = [t for t in tokens if t in acked and t not in done]
        if not waiting and not traffic.unacked_telegram:
            items = items_of_tokens(data_dir)
            paid = paid_items(data_dir)
            if all(items.get(t, set()) & paid for t in tokens if t in acked):
                return
        await asyncio.sleep(0.05)


async def _trial(number: int, plan: TrialPlan, driver: Driver, echo: SlowEcho,
                 data_dir: Path) -> TrialResult:
    traffic, gateway = driver.traffic, driver.gateway
    await _inputs(gateway, traffic, plan.telegram, plan.slack)
    traffic.phase = _kind(plan)
    switch = KillSwitch(plan, gateway, data_dir, lambda t: traffic.channel_of.get(t, ""))
    echo.slow = plan.slow
    rng = random.Random(plan.seed)
    driver.rng = traffic.rng = rng
    traffic.web_stream = 1.0 if switch.channel == "web" and switch.step in (
        "mid-stream", "after-final", "after-note") else 0.4
    traffic.tg.outbound.tap = traffic.slack.outbound.tap = switch.platform
    echo.on_call = switch.model_call
    traffic.on_web = switch.web
    sent = driver.sent
    began = time.monotonic()
    tokens: list[str] = []
    try:
        await _start(gateway, traffic)
        switch.arm()
        driver.retry_unacked()
        for i in range(BURST):
            # Half on the target channel of a step trial, so its step comes soon.
            target = switch.channel if switch.channel and i % 2 == 0 else None
            tokens.append(driver.one(target))
            await asyncio.sleep(rng.uniform(0.01, 0.06))  # the traffic's shape, not a wait
        settled = asyncio.ensure_future(_settled(driver, tokens, data_dir))
        fired = asyncio.ensure_future(switch.done.wait())
        seen = -1
        while switch.seen != seen and not (settled.done() or fired.done()):
            seen = switch.seen
            await asyncio.wait([settled, fired], timeout=SETTLE,
                               return_when=asyncio.FIRST_COMPLETED)
        for task in (settled, fired):
            task.cancel()
        await asyncio.wait([settled, fired])
        findings: list[str] = []
        if switch.fired is None:
            if plan.kill.startswith("step"):
                findings.append(f"its step ({plan.label}) never came")
            switch.kind = "event"  # end it as a kill all the same
            switch.fire(f"the end of its traffic ({switch.count} events)")
        code = await gateway.exited()
        if plan.kill.startswith("stop") and code not in (0, None):
            findings.append(f"SIGTERM exit code {code}")
    finally:
        traffic.tg.outbound.tap = traffic.slack.outbound.tap = None
        echo.on_call = None
        traffic.on_web = None
        await switch.aclose()
        await gateway.kill()
    await driver.settled()
    return TrialResult(number, plan, switch.fired or "?", driver.sent - sent,
                       time.monotonic() - began, findings)


def platform_state(traffic: Traffic) -> bytes:
    """What the platforms hold at the end, for whoever reads a kept run: the bot's messages
    (edits applied) and every web message's attempts and answer."""
    tg, slack = traffic.tg, traffic.slack
    state = {
        "telegram": [{"chat": chat, "message": mid, "text": m.get("text")}
                     for (chat, mid), m in tg.messages.items()
                     if m["from"]["id"] == tg.bot_user["id"]],
        "slack": [{"channel": channel, "ts": ts, "thread": m.get("thread_ts"),
                   "text": m.get("text"), "metadata": m.get("metadata")}
                  for (channel, ts), m in slack.messages.items()
                  if m.get("bot_id") == slack.bot_id],
        "web": [{"token": w.token, "id": w.client_id, "statuses": w.statuses,
                 "reply": w.reply} for w in traffic.web_messages],
        "sent": {token: channel for token, channel in traffic.channel_of.items()},
    }
    return orjson.dumps(state, option=orjson.OPT_INDENT_2)


def keep_on_failure(tmp_path: Path, name: str) -> Path:
    """Copy the data directory and the gateway's logs where the next run will not clean
    them up; the copy's path."""
    kept = OUTPUT / "failed-trials" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tmp_path, kept, dirs_exist_ok=True, ignore_dangling_symlinks=True)
    return kept


async def run_schedule(name: str, plans: list[TrialPlan], tmp_path: Path,
                       extra_env: dict[str, str] | None = None, *,
                       test: str | None = None) -> Summary:
    """Every trial of ``plans`` in order, then a final clean run; see the module docstring.
    ``test``: the name ``GATEWAY_TRIAL_SCHEDULE`` replays the run under (default ``name``)."""
    schedule = encode(plans)
    replay = f"{test or name}={schedule}"
    print(f"\n{name}: GATEWAY_TRIAL_SCHEDULE='{replay}'", flush=True)
    data_dir = tmp_path / "data"
    results: list[TrialResult] = []
    started = time.monotonic()
    async with FakeTelegramServer() as tg, FakeSlackServer() as slack, \
            FakeProviderServer() as llm, aiohttp.ClientSession() as http:
        echo = SlowEcho(random.Random(plans[0].seed if plans else 0), low=0.02, high=0.25)
        llm.default = echo
        traffic = Traffic(tg, slack, random.Random(0))
        port = free_port()
        env = gateway_env(data_dir, port, tg, slack, llm) | (extra_env or {})
        gateway = GatewayProcess(env, cwd=tmp_path, log_dir=tmp_path, port=port)
        driver = Driver(traffic, gateway, traffic.rng, http)
        before: dict[Path, bytes] = {}
        reported: set[str] = set()
        sent_in: dict[str, str] = {}  # bot message key -> the input whose run sent it
        try:
            for number, plan in enumerate(plans, start=1):
                result = await _trial(number, plan, driver, echo, data_dir)
                _note_senders(sent_in, traffic)
                logs = check_logs(data_dir)
                found = result.findings + check_prefixes(before, logs.files) + logs.problems
                found += [f"lost {m}" for m in missing(traffic.acknowledged(), logs,
                                                       owed_bodies(data_dir))]
                found += repeated(traffic, tg, slack, logs)
                result.findings = [f for f in found if f not in reported]
                reported.update(found)
                results.append(result)
                before = logs.files
            traffic.phase = "final clean run"
            await _inputs(gateway, traffic, "webhook", "http")
            final_began = time.monotonic()
            await _start(gateway, traffic)
            final = await final_run(driver, tg, slack)
            _note_senders(sent_in, traffic)
            print(f"{name}: final run {time.monotonic() - final_began:.1f} s", flush=True)
        finally:
            await gateway.kill()
        logs = check_logs(data_dir)
        final += check_prefixes(before, logs.files) + logs.problems
        final += [f"torn tail left in {p.name}" for p in logs.torn]
        final += [f"lost {m}" for m in missing(traffic.acknowledged(), logs)]
        final += repeated(traffic, tg, slack, logs)
        rows = tally(traffic, tg, slack, logs, Counter(_kind(r.plan) for r in results))
        served = Counter(f"telegram {r.plan.telegram}" for r in results)
        served.update(f"slack {r.plan.slack}" for r in results)
        served["web"] = len(results)
        inputs = tally_inputs(traffic, tg, slack, logs, Counter(
            {k: served[k] for k in INPUTS}))
        by_input: dict[str, Counter[str]] = {}
        for key, text in bot_message_keys(tg, slack).items():
            if (kind := stray_kind(text)) is not None:
                by_input.setdefault(sent_in.get(key, "?"), Counter())[kind] += 1
        (tmp_path / "platform.json").write_bytes(platform_state(traffic))
        summary = Summary(name, schedule, results, rows, acknowledged_by_channel(traffic),
                          strays(tg, slack), final, time.monotonic() - started,
                          inputs=inputs, strays_by_input=by_input, test=test or name)
    if summary.final or summary.with_findings or summary.total("twice") or summary.total(
            "never") or summary.total("lost"):
        summary.kept = keep_on_failure(tmp_path, name)
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / f"{name}.txt").write_text(summary.report())
    return summary


INPUTS = ("telegram polling", "telegram webhook", "slack http", "slack socket", "web")


def _note_senders(sent_in: dict[str, str], traffic: Traffic) -> None:
    """Note the input of the run just ended against each bot message it newly left on the
    platforms (a message keeps the run that sent it; later edits do not move it)."""
    for key in bot_message_keys(traffic.tg, traffic.slack):
        if key not in sent_in:
            channel = key.split(" ", 1)[0]
            sent_in[key] = traffic.input_now(channel)


def _kind(plan: TrialPlan) -> str:
    if plan.kill.startswith("step"):
        return plan.label
    if plan.kill.startswith("stop"):
        return "SIGTERM at a drawn event"
    return f"SIGKILL at a drawn event ({plan.kill.rsplit(':', 1)[1]} its call)"
