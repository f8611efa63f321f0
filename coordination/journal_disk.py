"""The owed journal's file on disk: appends, their shared fsyncs, and the rewrite.

:class:`coordination.journal.FileJournal` holds what is owed and remembered, and says which
lines to write; this is how those lines get to the disk and how the file is kept small, apart
because it is the journal's concurrency (fsyncs shared between conversations, a rewrite in a
thread while appends go on) and none of its bookkeeping. :class:`JournalDisk` is a base of
the journal, not a part of its own: it reads and sets the journal's file state (declared
below, set in the journal's ``__init__``) and asks the journal for its live records.

Writes are single ``os.write`` appends of whole lines, made inline (the page cache survives a
killed process); with durability ``always`` each is fsynced, otherwise the file is fsynced
when an answer is noted (end of a turn). Those fsyncs are shared (group commit): answers noted
while an fsync is running wait for it and then share the next one, so twenty conversations
ending their turns at once cost two fsyncs, not twenty, and each still
returns only once an fsync that began after its line was written has finished. An ``owe``
that cannot be written raises (the message
is then not acknowledged); a ``paid`` or ``drop`` that cannot be written is kept and written
ahead of the next line, retried by :meth:`FileJournal.flush`. A torn last line (killed
mid-write) is ignored. Keys past their ttl are expired in memory, and the file is rewritten
from what is live (owed items and unexpired keys) whenever it holds more than twice the lines
that needs, so it stays proportional to the traffic of one ttl. The rewrite runs in a thread
(a day of keys is megabytes and an fsync; :mod:`coordination.journal_file`) while appends go on
to the old file, then those appends follow the snapshot in the new file, which is synced again
and put in place; answers noted during that last fsync wait for it and sync the new file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from coordination import journal_file
from coordination.journal_lines import Snapshot, render
from sessions.files import write_all
from sessions.reserve import FULL_KINDS, Reserve
from sessions.sync_lane import FileSyncer

T = TypeVar("T")


class JournalDisk:
    """The file side of :class:`coordination.journal.FileJournal` (see the module docstring).

    Its state is the journal's, set in the journal's ``__init__`` (where each is explained)."""

    path: Path | None
    fsync: str
    _syncer: FileSyncer
    _sync_rewrite: Callable[[int], None]
    _write_file: Callable[[int, memoryview], int]
    _truncate_file: Callable[[int, int], None]
    _reserve: Reserve | None
    _fd: int | None
    _size: int
    _torn: bool
    _lines: int
    _backlog: bytes
    _writes: int
    _synced: int
    _syncing: asyncio.Future[None] | None
    _background: set[asyncio.Future[None]]
    _compaction: asyncio.Task[None] | None
    _tail: list[bytes] | None
    _swapping: asyncio.Future[None] | None

    def __len__(self) -> int:
        """Live records (the journal counts them)."""
        raise NotImplementedError

    def _snapshot(self) -> Snapshot:
        """The live records, for a rewrite (the journal takes them)."""
        raise NotImplementedError

    @property
    def pending_bytes(self) -> int:
        return len(self._backlog)

    async def flush(self) -> bool:
        """Write what earlier failures left pending; True once nothing is pending."""
        if not self._backlog:
            return True
        try:
            self._write(b"", keep=True)
        except OSError:
            return False
        return not self._backlog

    async def settle(self) -> bool:
        """The last flush, before :meth:`close`: what is pending is written (into the room
        the reserve gives back when the disk is full: a note not written here is an answer
        sent again after the next start) and made durable. True once nothing is pending."""
        if self._compaction is not None:  # it holds a new file and lines for it
            await asyncio.shield(self._compaction)
        if self._background:  # answers' fsyncs not waited for (paid(wait=False))
            await asyncio.gather(*self._background, return_exceptions=True)
        if not self._backlog:
            return True
        try:
            self._write(b"", keep=True)
        except OSError as exc:
            kind = errno.errorcode.get(exc.errno or 0, "")
            if not (kind in FULL_KINDS and self._reserve is not None
                    and await asyncio.to_thread(self._reserve.release)):
                return False
            try:
                self._write(b"", keep=True)
            except OSError:
                return False
        if self.fsync != "none":
            await self._sync()
        return not self._backlog

    def _write(self, line: bytes, *, keep: bool) -> None:
        """Append the backlog and ``line``. On failure the backlog stays (plus ``line`` when
        ``keep``) and the error is raised; the file is cut back to its last whole line."""
        data = self._backlog + line
        if self._fd is None:  # in memory only, or closed
            self._backlog = b""
            self._lines += data.count(b"\n")
            return
        # The size of the file's whole lines is kept here, not asked of the kernel before every
        # append: one system call fewer per line on the event loop's thread, which gives up the
        # GIL at each one (and may wait to get it back from a worker thread).
        try:
            if self._torn:  # a failed append's tail that could not be cut back last time
                self._truncate_file(self._fd, self._size)
                self._torn = False
            view = memoryview(data)
            done = 0
            while done < len(data):
                n = self._write_file(self._fd, view[done:])
                if n == 0:
                    raise OSError(errno.EIO, "write returned 0")
                done += n
        except OSError:
            try:
                self._truncate_file(self._fd, self._size)
                self._torn = False
            except OSError:  # cut before the next append, so no line is glued to a torn one
                self._torn = True
            if keep:
                self._backlog = data
            raise
        self._size += len(data)
        self._backlog = b""
        self._lines += data.count(b"\n")
        if data:
            self._writes += 1
            if self._tail is not None:
                self._tail.append(data)

    async def _sync(self) -> None:
        """Return once an fsync that began after everything written so far has ended.

        An fsync already running may have begun before our last write: wait for it, then
        look again; whoever finds none running starts the next one for everybody waiting.
        """
        target = self._writes
        while self._synced < target and self._fd is not None:
            if self._swapping is not None:  # a rewrite's new file is being installed
                await asyncio.shield(self._swapping)
            elif self._syncing is not None:
                await asyncio.shield(self._syncing)  # our cancellation must not end theirs
            else:
                await self._sync_once(self._fd)

    async def _sync_once(self, fd: int) -> None:
        upto = self._writes
        ended = asyncio.get_running_loop().create_future()
        self._syncing = ended
        try:
            with contextlib.suppress(OSError):  # in the page cache; a later sync tries again
                await self._syncer.sync(fd)
            self._synced = max(self._synced, upto)
        finally:  # cancelled too: the waiters look again (one of them starts another fsync)
            self._syncing = None
            ended.set_result(None)

    def fileno(self) -> int | None:
        """The descriptor of the file appended to now (another one after a rewrite; ``None``
        once closed)."""
        return self._fd

    def compact_now(self) -> None:
        """Rewrite the file to its live records at once, inline (a running journal does it in
        a thread once the file has grown); raises ``OSError`` when the disk refuses."""
        self._rewrite()

    @property
    def compacting(self) -> asyncio.Task[None] | None:
        """The rewrite in progress, if any (tests wait for it)."""
        return self._compaction

    async def _compact(self, snapshot: Snapshot) -> None:
        """The rewrite, off the event loop: the snapshot rendered, written and fsynced in a
        thread while the loop goes on appending to the old file; those appends then go after
        the snapshot, the new file is synced again (they may include lines an fsync of the old
        file already confirmed) and installed. Sync waiters wait during that last fsync, and
        the lines appended during it are synced by them, in the new file. A failure (a full or
        read-only disk) leaves the old file as it was: the next append tries again."""
        assert self.path is not None
        tmp = journal_file.temp_path(self.path)
        held: int | None = None  # the new file, until installed
        try:
            fd, size, lines = await _in_thread(
                functools.partial(self._write_snapshot, tmp, snapshot),
                after_cancel=lambda made: _discard_made(made, tmp))
            held = fd
            del snapshot
            size, lines = self._append_tail(fd, size, lines)
            self._swapping = asyncio.get_running_loop().create_future()
            try:
                await _in_thread(functools.partial(self._sync_rewrite, fd),
                                 after_cancel=lambda _: journal_file.discard(fd, tmp))
            except asyncio.CancelledError:
                held = None  # the thread still has it: discarded once its fsync ends
                raise
            size, lines = self._append_tail(fd, size, lines)
            if self._fd is None:  # closed meanwhile
                return
            old = self._install(fd, tmp, size, lines)
            held = None
            close_after(old, self._syncing)
        except OSError:
            return  # the old file stays; a later append tries again
        finally:
            if held is not None:
                journal_file.discard(held, tmp)
            self._tail = None
            self._compaction = None
            swapping, self._swapping = self._swapping, None
            if swapping is not None:
                swapping.set_result(None)

    def _write_snapshot(self, tmp: Path, snapshot: Snapshot) -> tuple[int, int, int]:
        """In the rewrite's thread: the new file (descriptor, bytes, lines)."""
        body, count = render(*snapshot)
        return journal_file.write_new(tmp, body, self._sync_rewrite), len(body), count

    def _append_tail(self, fd: int, size: int, lines: int) -> tuple[int, int]:
        """Append to the new file what was appended to the old one since the snapshot."""
        assert self._tail is not None
        data = b"".join(self._tail)
        self._tail.clear()
        write_all(fd, data)
        return size + len(data), lines + data.count(b"\n")

    def _rewrite(self) -> None:
        """The rewrite inline (at open, in its thread; or with no event loop running)."""
        if self.path is None or self._fd is None:
            self._lines = len(self)
            return
        os.close(self._swap_in_snapshot())

    def _swap_in_snapshot(self) -> int:
        """Write what is live to a new file and put it in place, inline; the old descriptor,
        for the caller to close. On any error the new file is discarded and the old one stays."""
        assert self.path is not None
        tmp = journal_file.temp_path(self.path)
        fd, size, lines = self._write_snapshot(tmp, self._snapshot())
        try:
            return self._install(fd, tmp, size, lines)
        except BaseException:
            journal_file.discard(fd, tmp)
            raise

    def _install(self, fd: int, tmp: Path, size: int, lines: int) -> int:
        """Put the new file in place and write to it from now on; the old descriptor."""
        assert self.path is not None
        assert self._fd is not None
        journal_file.install(fd, tmp, self.path)
        old, self._fd = self._fd, fd
        self._size, self._torn, self._lines = size, False, lines
        return old


async def _in_thread(call: Callable[[], T], *,
                     after_cancel: Callable[[T | None], object]) -> T:
    """``call()`` in a worker thread. Cancelling the wait (:meth:`FileJournal.close` during a
    rewrite) cannot stop the thread, so once it ends, ``after_cancel`` gets what it returned
    (None if it raised), on the loop if that still runs: a new file the rewrite opened is then
    closed and removed, neither leaked nor closed under a running fsync."""
    step = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        return await asyncio.shield(step)
    except asyncio.CancelledError:
        def ended(done: asyncio.Future[T]) -> None:
            failed = done.cancelled() or done.exception() is not None
            after_cancel(None if failed else done.result())

        step.add_done_callback(ended)
        raise


def _discard_made(made: tuple[int, int, int] | None, tmp: Path) -> None:
    """A new file a cancelled rewrite's first step made (none if it failed: it cleaned up)."""
    if made is not None:
        journal_file.discard(made[0], tmp)


def close_after(fd: int, running: asyncio.Future[None] | None) -> None:
    """Close the old file once no fsync of it is running (a descriptor closed under an fsync
    could be reused by another file, which the fsync would then sync)."""
    if running is None:
        os.close(fd)
    else:
        running.add_done_callback(lambda _done: os.close(fd))
