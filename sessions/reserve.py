"""Room held on the data directory's disk for the writes a close must not lose.

When the disk fills up, the gateway refuses what it cannot record (nothing new is
acknowledged), but a turn already running goes on: its session entries are accepted and kept
in memory until a write succeeds, and the owed journal keeps its notes of answers sent the same
way. A close is the last chance to write them (shutdown, a session evicted or rotated): a
close that finds the disk still full would drop entries of answers people already got, while
the journal says they were answered (so nothing brings them back).

The reserve is a file of ``size`` bytes (``<data>/state/reserve``, 0600) allocated while there
is room. The first close that meets a full disk (ENOSPC, EDQUOT) deletes it and writes again
into the room it gave back; :meth:`DiskReserve.ensure` allocates it again once there is room
(at start, and at most every ``retry_after`` seconds when a session is created).

It is room, not a promise: another process writing to the same disk may take the freed blocks
first. A release is logged (one warning): the operator learns the disk filled up.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sessions.files import FILE_MODE, ensure_private_dir, sync_dir

log = logging.getLogger(__name__)

RESERVE_FILE = "reserve"
DEFAULT_SIZE = 4 * 1024 * 1024
"""Bytes held back: many times what a close writes (the entries of the turns that were running,
a few KB each, and the journal's notes), small beside any real disk."""
FULL_KINDS = frozenset({"ENOSPC", "EDQUOT"})
"""Failure kinds (errno names) that room on the disk cures."""


class Reserve(Protocol):
    """Room a writer may give back to the disk when it is full and about to lose data."""

    @property
    def wanted(self) -> bool:
        """True while the room is not held and should be (:meth:`ensure` has work to do)."""
        ...

    def ensure(self) -> bool:
        """Hold the room if there is room for it (blocking, never raises); True when held."""
        ...

    def release(self) -> bool:
        """Free the held room (thread-safe, never raises). True when this call freed some:
        the caller writes again; False: nothing was held (released already, or never made)."""
        ...


class DiskReserve:
    """See the module docstring. ``size=0`` holds nothing (the reserve is off)."""

    def __init__(self, path: Path, size: int = DEFAULT_SIZE, *, retry_after: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.size = size
        self.retry_after = retry_after
        self.clock = clock
        self._guard = threading.Lock()
        self._held = False
        self._tried: float | None = None  # when ensure() last found no room

    @property
    def held(self) -> bool:
        return self._held

    @property
    def wanted(self) -> bool:
        return self.size > 0 and not self._held

    def ensure(self) -> bool:
        """Hold the room if it is not held yet (blocking: call it off the event loop). True
        when held. After a failure, tries again only ``retry_after`` seconds later."""
        if self._held or self.size <= 0:
            return self._held
        with self._guard:
            if self._held:
                return True
            now = self.clock()
            if self._tried is not None and now - self._tried < self.retry_after:
                return False
            try:
                self._allocate()
            except OSError as exc:
                self._tried = now
                log.warning("no room for the disk reserve (%d bytes at %s): %s; a stop while "
                            "the disk is full may lose entries not written yet", self.size,
                            self.path, errno.errorcode.get(exc.errno or 0, type(exc).__name__))
                return False
            self._held, self._tried = True, None
            return True

    def _allocate(self) -> None:
        ensure_private_dir(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_size >= self.size:  # left by the last run
                return
        temporary = self.path.with_name(f".{self.path.name}.new")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            # Blocks really allocated (not a sparse file): deleting it gives them back.
            os.posix_fallocate(fd, 0, self.size)
            os.fsync(fd)
        except OSError:
            os.close(fd)
            temporary.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(temporary, self.path)

    def release(self) -> bool:
        with self._guard:
            if not self._held:
                return False
            self._held = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                return False
            except OSError as exc:  # e.g. the disk also went read-only: nothing to give back
                log.warning("could not release the disk reserve at %s: %s", self.path,
                            type(exc).__name__)
                return False
            # Some filesystems give freed blocks back only once the deletion is committed.
            with contextlib.suppress(OSError):
                sync_dir(self.path.parent)
        log.warning("the disk is full: released the %d-byte reserve (%s) to write what a close "
                    "would have lost; it is made again once there is room", self.size, self.path)
        return True
