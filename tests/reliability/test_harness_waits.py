"""The trials' waits on a gateway process are bounded by its progress, never by the whole.

On a machine at load 10-24 a clean stop (or a cold start) can take far longer than when it is
quiet, while the process works on steadily. A fixed bound then SIGKILLs a process that was
stopping cleanly, which is a different trial than the one planned: killed while the disk is
full, a stop becomes the window docs/architecture.md leaves open (an answer out, its entries
only in memory), and the trial reports an acknowledged message never answered. These tests
shrink :data:`tests.reliability.crash_harness.STALL` to a second and use stand-in processes.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from tests.reliability import crash_harness
from tests.reliability.crash_harness import GatewayProcess
from tests.waiting import until

# A stand-in for a gateway that takes a while to stop: on SIGTERM it goes on writing a line
# every 50 ms (its log grows: progress) for STOPPING seconds, then exits 0.
SLOW_STOP = """
import signal, sys, time
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
print("ready", flush=True)
while not stopping:
    time.sleep(0.01)
while time.monotonic() - stopping[0] < float(sys.argv[1]):
    print("closing", flush=True)
    time.sleep(0.05)
sys.exit(0)
"""

# A stand-in for a gateway that hangs in its stop: SIGTERM ignored, no output, no CPU.
HUNG = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


async def started(tmp_path: Path, script: str, *args: str) -> GatewayProcess:
    gateway = GatewayProcess({}, cwd=tmp_path, log_dir=tmp_path, port=0)
    gateway.runs = 1
    with gateway.log.open("wb") as log:
        gateway.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, *args, stdout=log, stderr=log)
    await until(lambda: b"ready" in gateway.log.read_bytes(), what="the stand-in to start")
    return gateway


async def test_a_slow_stop_that_makes_progress_is_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop taking three times the stall bound, writing as it goes, ends by itself with its
    own exit code: never SIGKILLed for being slow."""
    monkeypatch.setattr(crash_harness, "STALL", 1.0)
    gateway = await started(tmp_path, SLOW_STOP, "3")
    try:
        assert await gateway.stop() == 0
    finally:
        await gateway.kill()


async def test_a_stop_that_makes_no_progress_is_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that neither spends CPU nor writes after SIGTERM is SIGKILLed once the stall
    bound passes, and the wait says so (None)."""
    monkeypatch.setattr(crash_harness, "STALL", 1.0)
    gateway = await started(tmp_path, HUNG)
    assert await gateway.stop() is None
    assert gateway.proc is not None
    assert gateway.proc.returncode == -signal.SIGKILL
