"""A session is never closed under a running fsync: a caller that stops waiting for
``sync()`` (a persist timeout, a cancelled turn) leaves the fsync to finish, and ``aclose``
waits for it before the descriptor is closed (an fsync reaching a closed, maybe reused,
descriptor would sync another file)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from sessions.jsonl import JsonlSessionStore
from tests.sessions.helpers import add, user

WAIT = 30.0  # seconds; only a broken test ever waits this long


class HeldFsyncDisk:
    """``FileOps`` over the real disk whose fsyncs wait until :meth:`release`, recording the
    order of fsyncs and closes into ``events``."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.started = threading.Event()
        self.gate = threading.Event()

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.events.append("fsync start")
        self.started.set()
        if not self.gate.wait(WAIT):
            raise AssertionError("the fsync was never released")
        os.fsync(fd)
        self.events.append("fsync end")

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        self.events.append("close")
        os.close(fd)

    def release(self) -> None:
        self.gate.set()


async def test_a_caller_that_stops_waiting_leaves_the_fsync_to_finish_before_the_close(
        tmp_path: Path) -> None:
    """sync() given up by its caller (a timeout): the fsync keeps the descriptor; aclose
    waits for it instead of closing the file under it."""
    disk = HeldFsyncDisk()
    store = JsonlSessionStore(tmp_path, durability="turn", ops=disk)
    writer = await store.create(channel="web", conversation="ada", session_id="s1")
    await add(writer, user("hello"))
    syncing = asyncio.create_task(writer.sync())
    assert await asyncio.to_thread(disk.started.wait, WAIT)
    syncing.cancel()
    closing = asyncio.create_task(writer.aclose())
    for _ in range(100):  # the close runs as far as it goes on the loop (a close that did
        await asyncio.sleep(0)  # not wait would be done here, under the held fsync)
    disk.release()
    async with asyncio.timeout(WAIT):
        await closing
    assert syncing.cancelled()
    # The close came after the held fsync ended, however long it was held: it waited.
    assert disk.events.index("fsync end") < disk.events.index("close")
