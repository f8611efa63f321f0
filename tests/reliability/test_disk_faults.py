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

Telegram's input is enumerated per fault (ENOSPC: webhook, EROFS: polling), so both refusal
paths run in every run. Mounting needs root (or CAP_SYS_ADMIN): elsewhere the test skips,
saying so. The seed is printed (``GATEWAY_CRASH_SEED`` replays it); the summary and a table by
phase go to ``test-output/disk-<fault>.txt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import time
from collections import Counter
from pathlib import Path

import aiohttp
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
    telegram_input,
)
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


async def paced(driver: Driver, rng: random.Random, count: int, *, fresh: bool) -> None:
    """``count`` messages a few dozen milliseconds apart; with ``fresh`` every other one starts
    a conversation."""
    for i in range(count):
        if fresh and i % 2 == 0:
            driver.one_new()
        else:
            driver.one()
        await asyncio.sleep(rng.uniform(0.03, 0.12))


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_disk_fault_under_load_then_recovery(
        fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Disk full or read-only under load: what could not be recorded was refused, never
    acknowledged; after recovery every acknowledged message is recorded and answered once."""
    seed = int(os.environ.get("GATEWAY_CRASH_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    disk = Tmpfs(tmp_path / "disk", TMPFS_SIZE)
    try:
        disk.mount()
    except MountRefused as exc:
        capabilities.missing(f"the disk-fault trials mount a tmpfs, which is not permitted "
                             f"here (needs root or CAP_SYS_ADMIN): {exc}")
    data_dir = disk.path / "data"
    findings: list[str] = []
    window: set[str] = set()
    stop_note = ""
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        async with FakeTelegramServer() as tg, FakeSlackServer() as slack, \
                FakeProviderServer() as llm, aiohttp.ClientSession() as http:
            llm.default = SlowEcho(rng, low=0.02, high=0.15)
            traffic = Traffic(tg, slack, rng)
            port = free_port()
            gateway = GatewayProcess(gateway_env(data_dir, port, tg, slack, llm), cwd=tmp_path,
                                     log_dir=tmp_path, port=port)
            driver = Driver(traffic, gateway, rng, http)
            await telegram_input(gateway, tg, FAULTS[fault])
            try:
                await gateway.start()
                traffic.phase = "before"
                await paced(driver, rng, WARM_UP, fresh=False)
                traffic.phase = fault
                if fault.startswith("enospc"):
                    disk.fill()
                else:
                    disk.read_only(data_dir)
                await paced(driver, rng, DURING, fresh=True)
                await asyncio.sleep(1.0)  # answers to deliveries still in flight come in
                during = check_logs(data_dir)  # readable either way
                findings += [f"acknowledged but not recorded during {fault}: {m}"
                             for m in missing(traffic.acknowledged(), during)]
                refused = refusals(traffic)
                # Polling: updates whose offset is held (or not asked for yet) at the end.
                held = len(traffic.unacked_telegram) if FAULTS[fault] == "polling" else None
                if fault == "enospc-stop":
                    stopping = time.monotonic()
                    code = await gateway.stop()
                    timings["stop"] = time.monotonic() - stopping
                    if code != 0:
                        findings.append(f"stop with the disk full exited with {code}")
                    window = unnoted(data_dir, tg, slack)
                    # Whether the stop needed the reserve (it does when a running turn's
                    # writes failed past the last page the files had: about one run in four).
                    released = "released the" in (tmp_path / "gateway-1.log").read_text()
                    stop_note = f"reserve {'released' if released else 'not needed'} at the stop; "
                    findings += [f"{t}: answered, but the journal did not note it at the stop "
                                 "(the reserve should have made room)" for t in sorted(window)]
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
                findings += await final_run(driver, tg, slack)
            finally:
                await gateway.kill()
                await driver.settled()
            logs = check_logs(data_dir)
            findings += logs.problems + [f"torn tail left in {p.name}" for p in logs.torn]
            findings += [f"lost {m}" for m in missing(traffic.acknowledged(), logs,
                                                      owed_bodies(data_dir))]
            # Sent again after the restart, as documented: a reply the platform took while the
            # journal could not note it answered (no room), the gateway stopped before it could.
            resent = {t for t, n in answered(tg, slack).items() if n == 2 and t in window}
            findings += [f for f in repeated(traffic, tg, slack, logs)
                         if f not in {f"{t} answered 2 times" for t in resent}
                         and not f.startswith(tuple(f"  {t}: " for t in resent))]
            rows = tally(traffic, tg, slack, logs, Counter({fault: 1}))
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
    line = (f"disk fault {fault} (telegram {FAULTS[fault]}), seed {seed}, "
            f"{time.monotonic() - started:.1f} s: {driver.sent} messages sent, "
            f"{total.acknowledged} acknowledged, {total.once} answered once, "
            f"{total.twice} answered twice, {total.never} never answered, {total.recorded} "
            f"recorded, {total.lost} lost; refused during the fault: "
            f"{dict(refused) or 'nothing'}"
            f"{'' if held is None else f', {held} Telegram updates not confirmed'}; "
            f"{len(resent)} answered again after the restart (replies out while the journal "
            f"could not note them, {len(window)} such at the stop); "
            f"{''.join(f'{k} {v:.1f} s; ' for k, v in timings.items())}{stop_note}"
            f"{'ok' if not findings else 'FINDINGS: ' + '; '.join(findings[:5])}")
    table = "\n".join([TABLE_HEAD, *(r.cells() for r in [*rows, total])])
    REPORT_DIR.mkdir(exist_ok=True)
    (REPORT_DIR / f"disk-{fault}.txt").write_text(f"{line}\n\n{table}\n")
    with capsys.disabled():
        print(f"\n{line}\n{table}")
    context = f"{line}\nlogs and a copy of the data in {tmp_path}\n" + "\n".join(findings[:40])
    # The fault bit (something was refused, and only ever with a 503), nothing acknowledged
    # went unrecorded, and every acknowledged message was answered exactly once.
    assert sum(refused.values()) > 0, context
    assert unexpected == {}, context
    assert total.acknowledged > 0, context
    assert total.acknowledged == total.recorded == total.once + len(resent), context
    assert total.twice == len(resent), context
    assert findings == [], context
