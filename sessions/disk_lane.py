"""The disk lane: one thread that performs a JSONL store's file writes, so the event loop never
waits on a disk.

A write to a regular file cannot be made non-blocking. On a hung disk (a dead NFS server, a
frozen filesystem, a failing device throttling dirty pages) ``os.write`` blocks for as long as
the disk hangs, and if it ran on the event loop every conversation would stop with it; no
timer could fire. So writers hand their bytes to the lane and return: the entries are accepted
(:class:`sessions.store.SessionWriter`) and the lane writes them, in order, in its own thread.

The lane notes when its current job started. A writer whose write has been running longer than
its ``stall_after`` reports ``STALLED`` (a failed write, counted and logged by the caller) and
keeps accepting entries into its backlog, up to its cap: the turn goes on. When the disk
answers, the stuck job finishes and the backlog follows, in order.

Disk operations go through :class:`FileOps` (the real ones by default), the seam tests use to
make a disk fail or hang. The thread starts with the first job and exits after a second with
nothing to do, so an idle store holds no thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from sessions import wakeup

log = logging.getLogger(__name__)

T = TypeVar("T")

IDLE_EXIT = 1.0
"""Seconds the thread waits for a job before it exits (it restarts with the next one)."""


class FileOps(Protocol):
    """The disk operations a JSONL writer needs; each may raise ``OSError`` (or block)."""

    def write(self, fd: int, data: memoryview) -> int: ...

    def fsync(self, fd: int) -> None: ...

    def truncate(self, fd: int, size: int) -> None: ...

    def close(self, fd: int) -> None: ...


class OsFileOps:
    """The real disk."""

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)


class DiskLane:
    """A queue of disk jobs run in order by one thread. See the module docstring."""

    def __init__(self, name: str = "disk-lane") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False
        self._busy_since: float | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` in the lane after the jobs before it (it must handle its own errors)."""
        with self._lock:
            self._jobs.put(job)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=self._name, daemon=True).start()

    async def call(self, job: Callable[[], T]) -> T:
        """Run ``job`` in the lane and wait for its result (or its exception) without blocking
        the event loop. Cancelling the wait does not cancel the job."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: T | None, error: BaseException | None) -> None:
            if future.done():  # the waiter gave up (timeout): nobody wants the result
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]  # T when no error

        def run() -> None:
            try:
                result: T | None = job()
                error: BaseException | None = None
            except BaseException as exc:  # handed to the waiter, never lost in the thread
                result, error = None, exc
            wakeup.post(loop, functools.partial(settle, result, error))

        self.submit(run)
        return await future

    def stalled_for(self) -> float:
        """Seconds the current job has been running (0 when the lane is idle)."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_EXIT)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._running = False
                        return
                continue
            self._busy_since = time.monotonic()
            try:
                job()
            except Exception:  # a job's own bug must not stop the writes queued after it
                log.exception("disk lane job failed")
            finally:
                self._busy_since = None
