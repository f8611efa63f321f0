"""A disk that fails, hangs or dies on demand, at the JSONL writer's ``FileOps`` seam.

``JsonlSessionStore(data_dir, ops=disk)`` writes real files through it:

* ``disk.fail(OSError(errno.ENOSPC, ...))``: every write and fsync raises that error (as a full
  or failing device does) until :meth:`FaultyDisk.recover`;
* ``disk.fail("hang")``: every write blocks (as on a dead NFS server or a frozen filesystem)
  until :meth:`FaultyDisk.recover`; it blocks the store's disk-lane thread, never the caller;
* :meth:`FaultyDisk.crash`: the process "dies": from then on nothing reaches the files (writes
  claim success, as the kernel would never see them), and closing still releases the locks,
  as the kernel does for a killed process.
"""

from __future__ import annotations

import os
import threading

Fault = OSError | str | None


class FaultyDisk:
    """``FileOps`` over the real disk, with faults on demand. See the module docstring."""

    def __init__(self) -> None:
        self._fault: Fault = None
        self._released = threading.Event()
        self._released.set()
        self.dead = False
        self.failures = 0
        self.hung = threading.Event()
        """Set once a write has started to hang (tests wait for it)."""
        self.events: list[str] = []
        """What reached the disk, in order: "hung", "released", "close" (the order tells a
        close that waited for a hung operation from one that went ahead of it)."""

    def fail(self, fault: OSError | str) -> None:
        self._fault = fault
        if fault == "hang":
            self._released.clear()

    def recover(self) -> None:
        self._fault = None
        self._released.set()

    def crash(self) -> None:
        self.dead = True
        self._released.set()

    def _check(self) -> bool:
        """False when the process is dead (the operation must not touch the file)."""
        if self._fault == "hang" and not self.dead:
            self.events.append("hung")
            self.hung.set()
            self._released.wait()
            self.events.append("released")
        if self.dead:
            return False
        fault = self._fault
        if isinstance(fault, OSError):
            self.failures += 1
            raise fault
        return True

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data) if self._check() else len(data)

    def fsync(self, fd: int) -> None:
        if self._check():
            os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        if not self.dead:
            os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        self.events.append("close")
        os.close(fd)
