"""The writer of one JSONL session file: entries accepted at once, written in order by the
store's disk lane (:mod:`sessions.disk_lane`), so a hung disk never blocks the event loop.

:meth:`JsonlSessionWriter.append` encodes the entries, accepts them (seq numbers, state; see
:class:`sessions.store.SessionWriter`), queues their bytes and returns without waiting for the
disk: the lane writes whole lines with one ``write`` per batch of queued appends, within
:data:`WRITE_DELAY` of the first of them or at the next :meth:`~JsonlSessionWriter.flush`,
whichever comes first. (Waking the lane's thread for every append would make it fight the
event loop for the GIL on every call; a batch per turn costs one hand-off.) A failed or
short write is rolled back with ``ftruncate`` to the last whole line and its bytes stay queued,
ahead of anything appended later, until a write succeeds; meanwhile each append reports the
failure (``SessionWriteError(kind, accepted=True)``). A write stuck longer than ``stall_after``
seconds is reported the same way (kind ``STALLED``) and appends keep being accepted: the turn
goes on. Past :data:`MAX_BACKLOG_BYTES` of unwritten bytes the writer gives up (``BACKLOG_FULL``,
then ``BROKEN``).

Waiting points, each bounded by the caller: :meth:`flush` (everything accepted is in the file:
the gateway waits for it before acknowledging a message and before sending an answer),
:meth:`sync` (also ``fsync``, per the durability setting) and :meth:`aclose`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sessions import entries
from sessions.disk_lane import DiskLane, FileOps
from sessions.errors import SessionWriteError
from sessions.names import utc_iso
from sessions.reserve import FULL_KINDS, Reserve
from sessions.store import Durability, SessionState
from sessions.sync_lane import FileSyncer

log = logging.getLogger(__name__)

MAX_BACKLOG_BYTES = 16 * 1024 * 1024
"""Accepted-but-unwritten bytes a writer holds while its disk fails, before it gives up."""

WRITE_DELAY = 0.001
"""Seconds an accepted append may wait in memory for more appends to share its write."""

BATCH_BYTES = 64 * 1024
"""Queued bytes that go to the lane at once, without waiting for WRITE_DELAY (a caller that
appends in a loop without yielding to the event loop never lets the timer run)."""

STALLED = "STALLED"
"""The failure kind of a write that has not returned within ``stall_after`` seconds."""

CLOSE_WAIT = 5.0
"""Seconds :meth:`JsonlSessionWriter.aclose` waits for the disk before it lets the lane finish
the close on its own (the file, and its lock, are released when the disk answers)."""


def errno_kind(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


class JsonlSessionWriter:
    """Single writer of one JSONL session file. See :class:`sessions.store.SessionWriter`."""

    def __init__(self, path: Path, fd: int, session_id: str, tenant: str, state: SessionState,
                 size: int, durability: Durability, *, lane: DiskLane, ops: FileOps,
                 syncer: FileSyncer,
                 stall_after: float = 2.0,
                 on_close: Callable[[JsonlSessionWriter], None] | None = None,
                 reserve: Reserve | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._session_id = session_id
        self._tenant = tenant
        self._state = state
        self._durability = durability
        self._lane = lane
        self._ops = ops
        self._syncer = syncer  # the store's sync lane (sync()'s fsync)
        self._stall_after = stall_after
        self._on_close = on_close
        self._reserve = reserve  # room a close may free when the disk is full
        self._clock = clock  # what each entry's ts reads (the store's; tests pin it)
        self._closed = False  # the loop's side: no appends after aclose() began
        self._closing: asyncio.Future[None] | None = None  # done once aclose() has finished
        self._kick: asyncio.TimerHandle | None = None  # the pending WRITE_DELAY wake-up
        self._broken = False
        self._fsyncs: set[asyncio.Future[None]] = set()  # sync()'s fsyncs still running
        # Shared between the event loop and the lane's thread, under _guard:
        self._guard = threading.Lock()
        self._queued: list[bytes] = []
        self._queued_bytes = 0
        self._inflight_bytes = 0
        self._scheduled = False
        self._error: str | None = None  # kind of the last failed write, until one succeeds
        self._dirty = False
        # The lane's side only:
        self._fd: int | None = fd
        self._size = size

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def tenant(self) -> str:
        return self._tenant

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def path(self) -> Path:
        return self._path

    @property
    def completes_inline(self) -> bool:
        """True when :meth:`append` never suspends (no fsync per append), so a timeout around
        it could never fire: callers may skip arming one."""
        return self._durability != "always"

    @property
    def pending_bytes(self) -> int:
        """Bytes accepted but not yet in the file (queued, or kept after a failed write)."""
        with self._guard:
            return self._queued_bytes + self._inflight_bytes

    async def append(self, items: Sequence[Mapping[str, Any]]) -> int:
        if self._closed:
            raise SessionWriteError(self._session_id, "CLOSED", "writer is closed")
        if self._broken:
            raise SessionWriteError(self._session_id, "BROKEN", "earlier entries were lost")
        ts = utc_iso(self._clock())
        seq = self._state.next_seq
        # Encoding comes before acceptance: an entry that cannot be encoded refuses the batch.
        data = b"".join(entries.encode_line(item, seq + n, ts) + b"\n"
                        for n, item in enumerate(items))
        self._state.next_seq = seq + len(items)
        for item in items:
            self._state.advance(item)
        with self._guard:
            self._queued.append(data)
            self._queued_bytes += len(data)
            if self._queued_bytes + self._inflight_bytes > MAX_BACKLOG_BYTES:
                self._broken = True
                self._queued.clear()
                self._queued_bytes = 0
            error = self._error
            idle = not self._scheduled and not self._broken
            now = idle and self._queued_bytes >= BATCH_BYTES
            self._scheduled = self._scheduled or now
        if self._broken:
            raise SessionWriteError(self._session_id, "BACKLOG_FULL", "unwritten entries dropped")
        if now:
            self._lane.submit(self._write_queued)
        elif idle and self._kick is None:
            self._kick = asyncio.get_running_loop().call_later(WRITE_DELAY, self._wake)
        if self._durability == "always":
            await self.sync()
        elif error is not None:
            raise SessionWriteError(self._session_id, error, "kept for the next write",
                                    accepted=True)
        elif self._lane.stalled_for() > self._stall_after:
            raise SessionWriteError(self._session_id, STALLED, "the disk has not answered",
                                    accepted=True)
        return len(data)

    def _wake(self) -> None:
        """Hand the queued appends to the lane (on the loop, after WRITE_DELAY)."""
        self._kick = None
        with self._guard:
            if self._scheduled or not self._queued:
                return
            self._scheduled = True
        self._lane.submit(self._write_queued)

    async def flush(self) -> None:
        """Wait until everything accepted so far is in the file (not necessarily durable)."""
        await self._wait(self._flush_now)

    async def sync(self) -> None:
        """:meth:`flush`, then make it durable per the durability setting.

        The ``fsync`` goes to the store's sync lane (:mod:`sessions.sync_lane`), not the disk
        lane: writes of other sessions never queue behind it, and sessions syncing at once
        share one round of the lane's thread (one wake-up of the event loop, not one each).
        """
        await self._wait(self._flush_now)
        if self._closed:
            # aclose() began while the write ran: its close syncs the file, and an fsync
            # started here could reach the descriptor after the lane closed it.
            return
        with self._guard:
            dirty, self._dirty = self._dirty, False
        fd = self._fd
        if not dirty or fd is None or self._durability == "none":
            return
        # Shielded and tracked: a caller that stops waiting (a timeout, a cancelled turn)
        # leaves the fsync running, and aclose() waits for it before the descriptor is closed
        # (an fsync reaching a closed, maybe reused, descriptor would sync another file).
        job = asyncio.ensure_future(self._syncer.sync(fd))
        self._fsyncs.add(job)
        job.add_done_callback(_fsync_done(self._fsyncs))
        try:
            await asyncio.shield(job)
        except OSError as exc:
            raise SessionWriteError(self._session_id, errno_kind(exc), "fsync",
                                    accepted=True) from exc

    async def _wait(self, job: Callable[[], str | None]) -> None:
        if self._kick is not None:  # the job below writes what the wake-up would have
            self._kick.cancel()
            self._kick = None
        with self._guard:
            idle = not self._queued and not self._inflight_bytes and self._error is None
        if idle or self._fd is None:
            return
        if self._lane.stalled_for() > self._stall_after:  # do not queue behind a stuck write
            raise SessionWriteError(self._session_id, STALLED, "the disk has not answered",
                                    accepted=True)
        error = await self._lane.call(job)
        if error is not None:
            raise SessionWriteError(self._session_id, error, "kept for the next write",
                                    accepted=True)

    @property
    def closing(self) -> bool:
        """True once :meth:`aclose` has begun."""
        return self._closed

    async def aclose(self) -> None:
        """Write what is queued (once), sync, close the file. Idempotent (a second call waits
        for the first); waits at most :data:`CLOSE_WAIT` seconds for the disk (the lane then
        finishes the close alone)."""
        if self._closing is not None:
            await asyncio.shield(self._closing)
            return
        self._closed = True
        self._closing = asyncio.get_running_loop().create_future()
        if self._kick is not None:
            self._kick.cancel()
            self._kick = None
        try:
            if self._fsyncs:  # they hold the descriptor the close releases
                await asyncio.wait(set(self._fsyncs), timeout=CLOSE_WAIT)
            await asyncio.wait_for(self._lane.call(self._close_now), CLOSE_WAIT)
        except TimeoutError:
            log.warning("session %s: the disk did not answer; the file is closed when it does",
                        self._session_id)
        finally:
            self._closing.set_result(None)
            if self._on_close is not None:
                self._on_close(self)

    async def abandon(self) -> None:
        """Close a file that is being thrown away (a session whose creation failed: its header
        never got a name), dropping what is queued for it: nothing is lost there, so nothing
        is reported lost (the disk-fault trials saw "unwritten bytes lost" for every session
        a full disk refused to create)."""
        with self._guard:
            self._queued.clear()
            self._queued_bytes = 0
        await self.aclose()

    # -- in the lane's thread ----------------------------------------------------------------

    def _write_queued(self) -> None:
        with self._guard:
            self._scheduled = False
            data = b"".join(self._queued)
            self._queued.clear()
            self._queued_bytes = 0
            self._inflight_bytes = len(data)
        if not data or self._fd is None:
            with self._guard:
                self._inflight_bytes = 0
            return
        try:
            self._write_all(data)
        except OSError as exc:
            with self._guard:  # kept, ahead of anything queued meanwhile
                self._queued.insert(0, data)
                self._queued_bytes += len(data)
                self._inflight_bytes = 0
                self._error = errno_kind(exc)
            return
        with self._guard:
            self._inflight_bytes = 0
            self._error = None
            self._dirty = True

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                n = self._ops.write(self._fd, view[written:])
                if n == 0:
                    raise OSError(errno.EIO, "write returned 0")
                written += n
        except OSError:
            self._rollback()
            raise
        self._size += written

    def _rollback(self) -> None:
        """Cut the file back to the last whole line we know of."""
        assert self._fd is not None
        try:
            self._ops.truncate(self._fd, self._size)
        except OSError:
            # The file may now end in a partial line; the next open() repairs a torn tail.
            log.warning("session %s: rollback after failed append also failed", self._session_id)

    def _flush_now(self) -> str | None:
        self._write_queued()
        return self._error

    def _sync_now(self) -> str | None:
        self._write_queued()
        if self._error is not None:
            return self._error
        with self._guard:
            dirty, self._dirty = self._dirty, False
        if self._fd is None or not dirty or self._durability == "none":
            return None
        try:
            self._ops.fsync(self._fd)
        except OSError as exc:
            return errno_kind(exc)
        return None

    def _close_now(self) -> None:
        if self._fd is None:
            return
        try:
            error = self._sync_now()
            if (self.pending_bytes and error in FULL_KINDS and self._reserve is not None
                    and self._reserve.release()):
                error = self._sync_now()  # into the room the reserve gave back
            lost = self.pending_bytes
            if lost:
                log.warning("session %s: %d unwritten bytes lost at close (%s)",
                            self._session_id, lost, error)
            elif error is not None:
                log.warning("session %s: final sync failed (%s)", self._session_id, error)
        finally:
            fd, self._fd = self._fd, None
            self._ops.close(fd)  # also releases the flock


def _fsync_done(running: set[asyncio.Future[None]]) -> Callable[[asyncio.Future[None]], None]:
    """Forget a finished fsync, taking its outcome (nobody may be waiting for it any more)."""

    def done(job: asyncio.Future[None]) -> None:
        running.discard(job)
        if not job.cancelled():
            job.exception()

    return done
