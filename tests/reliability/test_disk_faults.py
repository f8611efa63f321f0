"""ENOSPC and EROFS under mixed load, then recovery: nothing acknowledged is lost.

The gateway (``gateway run``, a subprocess, as in the crash-kill trials) keeps its data
directory on a tiny tmpfs the test mounts. Under Telegram, Slack and web traffic the disk
fails: it fills up (a filler file takes every free block: ENOSPC), or goes read-only (EROFS,
see :mod:`tests.reliability.tmpfs` for how). Messages keep coming, half of them starting new
conversations (a new session file each). Then the disk is given back (the filler removed, the
read-only layer lifted), traffic goes on, the platforms redeliver what they were refused, and
a last message in every conversation is answered before a clean stop.

While the disk is bad, the gateway must refuse what it cannot record (503 with Retry-After to
Slack, the web and a Telegram webhook; a held offset for polling) rather than acknowledge it:
at the end of the fault every message acknowledged so far is in a session log, and some were
refused (the fault bit). After recovery every acknowledged message is recorded and answered
exactly once (on the platform and in the log), and every log replays cleanly.

``enospc-stop`` stops the gateway while the disk is still full. What the turns running then
accepted but could not write (session entries of answers already sent, the owed journal's
notes of those answers) is written at the stop into the room the disk reserve gives back
(:mod:`sessions.reserve`): nothing is lost from the log and nothing is answered again. (Before
the reserve, about one run in eight lost an acknowledged message from the log: its entries
were dropped at close while the journal noted it answered; and replies whose ``paid`` note
found no room were sent again after the restart.)

The fault begins at a step of the warm-up traffic, and ``enospc-stop`` stops the gateway at
a step of the fault's traffic: the n-th reply event (a Telegram or Slack send or edit, a model
call, a web answer), drawn, never a time. The plan is printed, and
``GATEWAY_TRIAL_SCHEDULE='disk=<fault>/<fill at>/<stop at>/<seed>'`` replays it (the other
faults skip). A run that finds anything keeps its data directory and the gateway's logs under
``test-output/failed-trials/`` and says where.

Telegram's input is enumerated per fault (ENOSPC: webhook, EROFS: polling), so both refusal
paths run in every run. Mounting needs root (or CAP_SYS_ADMIN): elsewhere the test skips,
saying so (in CI it fails). The summary and a table by phase go to
``test-output/disk-<fault>.txt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests import capabilities
from tests.fakes.providers import FakeProviderServer
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer
from tests.ports import free_port
from tests.reliability.crash_driver import TABLE_HEAD, Driver, Row, final_run, repeated, tally
from tests.reliability.crash_harness import (
    GatewayProcess,
    SlowEcho,
    Traffic,
    answered,
    check_logs,
    gateway_env,
    items_of_tokens,
    missing,
    owed_bodies,
    paid_items,
    strays,
    telegram_input,
)
from tests.reliability.crash_schedule import StepCounter
from tests.reliability.crash_trials import keep_on_failure
from tests.reliability.tmpfs import MountRefused, Tmpfs

FAULTS = {"enospc": "webhook", "erofs": "polling", "enospc-stop": "polling"}
"""Each fault and the Telegram input it runs with. ``enospc-stop``: the gateway is stopped
(SIGTERM) while the disk is still full, and started again once it has room: what it could not
write must survive the close."""
TMPFS_SIZE = 32 << 20
"""Room for the run's session logs many times over, small enough to fill in a moment."""
WARM_UP = 12
DURING = 30
"""Messages sent while the disk is bad (every other one starts a conversation)."""
AFTER = 12
REPORT_DIR = Path(__file__).resolve().parents[2] / "test-output"


def refusals(traffic: Traffic) -> Counter[str]:
    """Every answer that was not a 200 (or no answer at all), by channel and status."""
    found: Counter[str] = Counter()
    for message in traffic.slack_messages:
        found.update(f"slack {s}" for answers in message.statuses for s in answers
                     if s not in (200, None))
    for web in traffic.web_messages:
        found.update(f"web {s}" for s in web.statuses if s not in (200, None))
    found.update(f"telegram webhook {d.status}" for d in traffic.tg.webhook_deliveries
                 if d.status is not None and not 200 <= d.status < 300)
    return found


def unnoted(data_dir: Path, tg: FakeTelegramServer, slack: FakeSlackServer) -> set[str]:
    """Tokens the platforms got an answer for whose item the owed journal on disk does not
    note as answered (read after a stop: the next start sends those answers again)."""
    paid = paid_items(data_dir)
    items = items_of_tokens(data_dir)
    return {token for token in answered(tg, slack) if not items.get(token, set()) & paid}


def paid_in_journal(data_dir: Path, finding: str) -> bool:
    """Whether the message a :func:`missing` line names (by its token) is noted answered in
    the owed journal (its ``owe`` line, then its ``paid`` one)."""
    token = finding.rsplit("(", 1)[-1].rstrip(")")
    try:
        lines = (data_dir / "state" / "delivery.jsonl").read_bytes().splitlines()
    except FileNotFoundError:
        return False
    items: set[str] = set()
    paid: set[str] = set()
    for raw in lines:
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(line, list) and line and line[0] == "owe" and token in str(line[-1]):
            items.add(str(line[1]))
        elif isinstance(line, list) and line and line[0] == "paid":
            paid.add(str(line[1]))
    return bool(items & paid)


async def paced(driver: Driver, rng: random.Random, count: int, *, fresh: bool) -> None:
    """``count`` messages a few dozen milliseconds apart; with ``fresh`` every other one starts
    a conversation."""
    for i in range(count):
        if fresh and i % 2 == 0:
            driver.one_new()
        else:
            driver.one()
        await asyncio.sleep(rng.uniform(0.03, 0.12))


@dataclass(frozen=True)
class DiskPlan:
    """One disk-fault trial: the fault begins at reply event ``fill_at`` of the warm-up
    traffic (a step, not a time); ``enospc-stop`` stops the gateway at event ``stop_at``
    after it; ``seed`` is the traffic's. Written ``<fault>/<fill_at>/<stop_at>/<seed>``."""

    fault: str
    fill_at: int
    stop_at: int
    seed: int

    def encode(self) -> str:
        return f"{self.fault}/{self.fill_at}/{self.stop_at}/{self.seed}"

    @classmethod
    def decode(cls, text: str) -> DiskPlan:
        fault, fill_at, stop_at, seed = text.strip().split("/")
        if fault not in FAULTS:
            raise ValueError(f"bad disk trial {text!r}: fault one of {', '.join(FAULTS)}")
        return cls(fault, int(fill_at), int(stop_at), int(seed))


def plan_of(fault: str) -> DiskPlan:
    """The trial to run: ``GATEWAY_TRIAL_SCHEDULE='disk=<plan>'`` for this fault, else drawn
    (from ``GATEWAY_CRASH_SEED`` when set)."""
    given = os.environ.get("GATEWAY_TRIAL_SCHEDULE", "").strip()
    if given.startswith("disk="):
        plan = DiskPlan.decode(given.split("=", 1)[1])
        if plan.fault != fault:
            pytest.skip(f"GATEWAY_TRIAL_SCHEDULE replays {plan.fault}, not {fault}")
        return plan
    rng = random.Random(int(os.environ.get("GATEWAY_CRASH_SEED") or random.randrange(2**32)))
    return DiskPlan(fault, rng.randint(1, 2 * WARM_UP), rng.randint(1, 3),
                    rng.getrandbits(32))


async def at_step(counter: StepCounter, n: int, action: Callable[[], None],
                  driver: Driver, traffic_done: Awaitable[None]) -> str:
    """Run ``action`` at reply event ``n`` from now, or, when the traffic ends (sent and
    answered) before that many events, then; where it ran."""
    counter.at(n, action)
    await traffic_done
    await driver.settled()
    if not counter.done.is_set():
        counter.run_now(f"the end of the traffic ({counter.count} events)")
    return counter.what or "?"


# A backstop sized for a machine at load 10-24 (a run takes 40-90 s when quiet: two cold
# starts, 54 paced messages, a final run); every wait inside is bounded by progress.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_disk_fault_under_load_then_recovery(
        fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Disk full or read-only under load (from a step of the traffic on): what could not be
    recorded was refused, never acknowledged; after recovery every acknowledged message is
    recorded and has exactly one complete answer; stopped while full, nothing answered is
    lost from the log and nothing is sent twice."""
    plan = plan_of(fault)
    schedule = f"disk={plan.encode()}"
    print(f"\ndisk fault {fault}: GATEWAY_TRIAL_SCHEDULE='{schedule}'", flush=True)
    rng = random.Random(plan.seed)
    disk = Tmpfs(tmp_path / "disk", TMPFS_SIZE)
    try:
        disk.mount()
    except MountRefused as exc:
        capabilities.missing(f"the disk-fault trials mount a tmpfs, which is not permitted "
                             f"here (needs root or CAP_SYS_ADMIN): {exc}")
    data_dir = disk.path / "data"
    findings: list[str] = []
    window: set[str] = set()
    in_memory: list[str] = []
    stop_note = ""
    steps: dict[str, str] = {}
    timings: dict[str, float] = {}
    started = time.monotonic()
    counter = StepCounter()
    try:
        async with FakeTelegramServer() as tg, FakeSlackServer() as slack, \
                FakeProviderServer() as llm, aiohttp.ClientSession() as http:
            echo = SlowEcho(rng, low=0.02, high=0.15)
            llm.default = echo
            traffic = Traffic(tg, slack, rng)
            port = free_port()
            gateway = GatewayProcess(gateway_env(data_dir, port, tg, slack, llm), cwd=tmp_path,
                                     log_dir=tmp_path, port=port)
            driver = Driver(traffic, gateway, rng, http)
            tg.outbound.tap = slack.outbound.tap = counter.platform
            echo.on_call = counter.model_call
            traffic.on_web = counter.web
            await telegram_input(gateway, tg, FAULTS[fault])

            def begin_fault() -> None:
                traffic.phase = fault
                if fault.startswith("enospc"):
                    disk.fill()
                else:
                    disk.read_only(data_dir)

            try:
                await gateway.start()
                traffic.phase = "before"
                steps["fault at"] = await at_step(counter, plan.fill_at, begin_fault, driver,
                                                  paced(driver, rng, WARM_UP, fresh=False))
                stopped = asyncio.Event()
                if fault == "enospc-stop":
                    # SIGTERM at a step of the fault's traffic (its turns' replies): the
                    # messages after it meet a stopping, then a stopped, gateway.
                    counter.at(plan.stop_at, lambda: (gateway.signal_now(signal.SIGTERM),
                                                      stopped.set()))
                await paced(driver, rng, DURING, fresh=True)
                await driver.settled()
                during = check_logs(data_dir)  # readable either way
                # Recorded is in a session log or owed in the journal: a message whose session
                # write the full disk refused (kept in memory, written when there is room) is
                # acknowledged once its journal line is written.
                absent = missing(traffic.acknowledged(), during, owed_bodies(data_dir))
                # Answered (noted paid) while its session entries wait in memory for room:
                # the window docs/architecture.md states for a *kill* while the disk is full
                # (a stop writes them into the reserve, checked below). Counted, not a finding.
                in_memory = [m for m in absent if paid_in_journal(data_dir, m)]
                findings += [f"acknowledged but not recorded during {fault}: {m}"
                             for m in absent if m not in in_memory]
                refused = refusals(traffic)
                # Polling: updates whose offset is held (or not asked for yet) at the end.
                held = len(traffic.unacked_telegram) if FAULTS[fault] == "polling" else None
                if fault == "enospc-stop":
                    if not counter.done.is_set():
                        counter.run_now(f"the end of the traffic ({counter.count} events)")
                    steps["stopped at"] = counter.what or "?"
                    stopping = time.monotonic()
                    code = await gateway.exited()
                    timings["stop"] = time.monotonic() - stopping
                    if code != 0:
                        findings.append(f"stop with the disk full exited with {code}")
                    window = unnoted(data_dir, tg, slack)
                    # Whether the stop needed the reserve (it does when a running turn's
                    # writes failed past the last page the files had).
                    released = "released the" in gateway.log.read_text()
                    stop_note = f"reserve {'released' if released else 'not needed'} at the stop; "
                    findings += [f"{t}: answered, but the journal did not note it at the stop "
                                 "(the reserve should have made room)" for t in sorted(window)]
                tg.outbound.tap = slack.outbound.tap = None
                echo.on_call = None
                traffic.on_web = None
                if fault.startswith("enospc"):
                    disk.free()
                else:
                    disk.writable()
                if not gateway.running:
                    starting = time.monotonic()
                    await gateway.start()
                    timings["restart"] = time.monotonic() - starting
                traffic.phase = "after"
                await paced(driver, rng, AFTER, fresh=True)
                traffic.phase = "final clean run"
                finishing = time.monotonic()
                findings += await final_run(driver, tg, slack)
                timings["final run"] = time.monotonic() - finishing
            finally:
                await gateway.kill()
                await driver.settled()
            logs = check_logs(data_dir)
            findings += logs.problems + [f"torn tail left in {p.name}" for p in logs.torn]
            findings += [f"lost {m}" for m in missing(traffic.acknowledged(), logs,
                                                      owed_bodies(data_dir))]
            findings += repeated(traffic, tg, slack, logs)
            rows = tally(traffic, tg, slack, logs, Counter({fault: 1}))
            stray = strays(tg, slack)
            unexpected = {k: n for k, n in refusals(traffic).items()
                          if not k.endswith(" 503")}
    finally:
        # The tmpfs goes away with its contents: keep a copy of the data for the reader.
        with contextlib.suppress(OSError):
            shutil.copytree(data_dir, tmp_path / "data", dirs_exist_ok=True)
        disk.unmount()

    total = Row(f"{fault} (all phases)", 1,
                *(sum(getattr(r, f) for r in rows) for f in (
                    "acknowledged", "once", "twice", "never", "recorded", "lost")))
    line = (f"disk fault {fault} (telegram {FAULTS[fault]}) [{schedule}], "
            f"{time.monotonic() - started:.1f} s: {driver.sent} messages sent, "
            f"{''.join(f'{k} {v}; ' for k, v in steps.items())}"
            f"{total.acknowledged} acknowledged, {total.once} answered once, "
            f"{total.twice} answered twice, {total.never} never answered, {total.recorded} "
            f"recorded, {total.lost} lost; stray messages: {dict(stray) or 'none'}; refused "
            f"during the fault: {dict(refused) or 'nothing'}"
            f"{'' if held is None else f', {held} Telegram updates not confirmed'}; "
            f"{len(window)} answers out at the stop that the journal had not noted; "
            f"{len(in_memory)} answered while only in memory (the disk full); "
            f"{''.join(f'{k} {v:.1f} s; ' for k, v in timings.items())}{stop_note}"
            f"{'ok' if not findings else 'FINDINGS: ' + '; '.join(findings[:5])}")
    failed = bool(findings) or total.acknowledged != total.once or total.twice > 0
    kept = keep_on_failure(tmp_path, f"disk-{fault}") if failed else None
    table = "\n".join([TABLE_HEAD, *(r.cells() for r in [*rows, total])])
    where = f"\ndata directory and gateway logs kept in {kept}" if kept else ""
    REPORT_DIR.mkdir(exist_ok=True)
    (REPORT_DIR / f"disk-{fault}.txt").write_text(f"{line}\n\n{table}{where}\n")
    with capsys.disabled():
        print(f"\n{line}\n{table}{where}")
    context = (f"{line}\nreplay: GATEWAY_TRIAL_SCHEDULE='{schedule}'\nkept: {kept}\n"
               + "\n".join(findings[:40]))
    # The fault bit (something was refused, and only ever with a 503), nothing acknowledged
    # went unrecorded, and every acknowledged message has exactly one complete answer: an
    # answer out while the journal could not note it is edited, never sent again.
    assert sum(refused.values()) > 0, context
    assert unexpected == {}, context
    assert total.acknowledged > 0, context
    assert total.acknowledged == total.recorded == total.once, context
    assert total.twice == 0, context
    assert findings == [], context
