"""The owed journal's rewrite, as file operations: a new file written beside the journal, made
durable, then put in its place.

:class:`coordination.journal.FileJournal` rewrites its file from the live records when it has
grown to more than twice what they need. The file holds a day of answered keys (a duplicate
check across restarts), so on a busy gateway a rewrite is megabytes: 91 ms for 100,000 keys and
279 ms for 300,000 on the development machine, and an fsync. Done inline, that stalled every
conversation once per rewrite; so the journal writes the new file in a worker thread, appends
on the event loop what was written to the old file meanwhile, and installs it there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from sessions.files import FILE_MODE, write_all


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def write_new(tmp: Path, body: bytes, sync_file: Callable[[int], None]) -> int:
    """``tmp`` created (replacing a stale one) holding ``body``, fsynced; its descriptor, open
    for appending. Raises ``OSError`` and leaves no file behind."""
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, FILE_MODE)
    try:
        write_all(fd, body)
        sync_file(fd)
    except BaseException:
        discard(fd, tmp)
        raise
    return fd


def install(fd: int, tmp: Path, path: Path) -> None:
    """Lock the new file (one process per data directory) and put it in ``path``'s place."""
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.replace(tmp, path)


def discard(fd: int, tmp: Path) -> None:
    """Close and remove a new file that will not be installed (never raises). The name is
    removed only while it is still this file's: a rewrite abandoned at a stop is discarded
    when its thread ends, and by then another journal on the same path (a restart in the same
    process) may have made its own new file there."""
    with contextlib.suppress(OSError):
        mine, there = os.fstat(fd), os.stat(tmp)
        if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
            tmp.unlink()
    with contextlib.suppress(OSError):
        os.close(fd)
