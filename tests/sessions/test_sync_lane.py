"""The sync lane: fsyncs asked for while a round runs share the next round; each waiter gets
an fsync that began after it asked, and its own outcome."""

from __future__ import annotations

import asyncio
import errno
import threading

import pytest

from sessions.sync_lane import SyncLane
from tests.waiting import until


class HeldDisk:
    """An fsync that notes each call and, while ``hold`` is clear, waits for it."""

    def __init__(self, failing: set[int] | None = None) -> None:
        self.calls: list[int] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.failing = failing or set()

    def fsync(self, fd: int) -> None:
        self.calls.append(fd)
        self.entered.set()
        assert self.hold.wait(10), "the test never released the disk"
        if fd in self.failing:
            raise OSError(errno.EIO, "I/O error")


async def wait_entered(disk: HeldDisk) -> None:
    assert await asyncio.to_thread(disk.entered.wait, 10)


async def test_requests_made_during_a_round_share_the_next_one() -> None:
    disk = HeldDisk()
    lane = SyncLane(disk.fsync)
    disk.hold.clear()
    first = asyncio.ensure_future(lane.sync(1))
    await wait_entered(disk)  # round 1 holds fd 1
    later = [asyncio.ensure_future(lane.sync(fd)) for fd in (2, 3, 2, 1)]
    await asyncio.sleep(0)
    assert not any(job.done() for job in [first, *later])
    disk.hold.set()
    await asyncio.wait_for(asyncio.gather(first, *later), 10)
    # Round 2 synced each descriptor once for all its waiters, fd 1 again: its second
    # waiter asked while the first fsync was running, which may have begun before its write.
    assert disk.calls == [1, 2, 3, 1]
    assert lane.rounds == 2


async def test_a_failure_reaches_only_the_waiters_of_that_file() -> None:
    disk = HeldDisk(failing={7})
    lane = SyncLane(disk.fsync)
    disk.hold.clear()
    blocker = asyncio.ensure_future(lane.sync(5))
    await wait_entered(disk)
    bad = [asyncio.ensure_future(lane.sync(7)) for _ in range(2)]
    good = asyncio.ensure_future(lane.sync(8))
    await asyncio.sleep(0)
    disk.hold.set()
    await asyncio.wait_for(asyncio.gather(blocker, good), 10)
    for job in bad:
        with pytest.raises(OSError, match="I/O error") as caught:
            await job
        assert caught.value.errno == errno.EIO


async def test_a_waiter_that_gives_up_leaves_the_fsync_running() -> None:
    disk = HeldDisk()
    lane = SyncLane(disk.fsync)
    disk.hold.clear()
    gone = asyncio.ensure_future(lane.sync(4))
    await wait_entered(disk)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    disk.hold.set()
    await asyncio.wait_for(lane.sync(4), 10)  # the lane goes on after the abandoned round
    assert disk.calls == [4, 4]


async def test_a_broken_seam_fails_its_waiters_instead_of_hanging_them() -> None:
    def broken(fd: int) -> None:
        raise ValueError("bug in the seam")

    with pytest.raises(OSError, match="bug in the seam"):
        await asyncio.wait_for(SyncLane(broken).sync(3), 10)


async def test_the_thread_exits_when_idle_and_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sessions.sync_lane.IDLE_EXIT", 0.01)
    disk = HeldDisk()
    lane = SyncLane(disk.fsync, name="fsync:test-idle")
    await asyncio.wait_for(lane.sync(1), 10)
    await until(lambda: not any(t.name == "fsync:test-idle" for t in threading.enumerate()),
                what="the idle lane's thread to exit")
    await asyncio.wait_for(lane.sync(2), 10)
    assert disk.calls == [1, 2]
