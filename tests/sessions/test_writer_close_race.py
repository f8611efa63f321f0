"""A turn no longer waits for its end-of-turn fsync (``SessionRecorder.sync_soon``), so a
conversation can be closed (evicted, erased, shut down) while that sync is still writing:
no fsync of the descriptor may begin once the close has begun (the close syncs the file
itself, and an fsync sent after it could reach the descriptor closed, or reused)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from sessions.disk_lane import DiskLane, OsFileOps
from sessions.jsonl import JsonlSessionWriter
from sessions.store import SessionState
from sessions.sync_lane import SyncLane
from tests.sessions.helpers import add, log_entries, user

WAIT = 30.0  # seconds; only a broken test ever waits this long


class HeldCloseSync(OsFileOps):
    """The real disk, but the close's own fsync (in the disk lane) waits for ``gate``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.holding = threading.Event()

    def fsync(self, fd: int) -> None:
        self.holding.set()
        if not self.gate.wait(WAIT):
            raise AssertionError("the close's fsync was never released")
        os.fsync(fd)


async def test_a_sync_that_meets_a_close_leaves_the_fsync_to_the_close(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    ops = HeldCloseSync()
    late: list[int] = []  # fsyncs of the sync lane, i.e. sent by sync() rather than the close
    writer = JsonlSessionWriter(path, fd, "s", "default", SessionState(), 0, "turn",
                                lane=DiskLane(), ops=ops,
                                syncer=SyncLane(lambda n: late.append(n) or os.fsync(n)))
    await add(writer, user("hello"))
    syncing = asyncio.create_task(writer.sync())
    await asyncio.sleep(0)  # the sync hands its write to the disk lane and waits for it
    closing = asyncio.create_task(writer.aclose())
    await asyncio.sleep(0)  # the close has begun: it queues behind that write
    try:
        # The close's fsync is held, so the descriptor is still open when the sync resumes.
        assert await asyncio.to_thread(ops.holding.wait, WAIT)
        async with asyncio.timeout(WAIT):
            await syncing
    finally:
        ops.gate.set()
    async with asyncio.timeout(WAIT):
        await closing
    assert late == []
    assert [e.get("message", {}).get("content") for e in log_entries(path)] == ["hello"]
