"""Private files, and reading files that may have been planted by someone else.

Every file the gateway keeps under its data folder is 0600 in a 0700 folder: session logs,
dedup journals and pairing state hold what people wrote; only the gateway's user may read them,
whatever the umask.

Reading goes through :func:`read_regular` and :func:`read_first_line`, never ``open()`` on a
name found by a directory scan: anything named ``*.jsonl`` in a sessions folder may be a
directory, a FIFO (an ``open`` for reading would wait for a writer forever), a symlink to
``/dev/zero`` (a read that never ends) or a link out of the data folder. Files are opened with
``O_NONBLOCK`` (a FIFO opens at once) and, unless the caller follows links on purpose,
``O_NOFOLLOW``; what is open must then be a regular file. A first line is read only up to a
bound.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from sessions.errors import NotARegularFileError

DIR_MODE = 0o700
FILE_MODE = 0o600
MAX_FIRST_LINE = 1024 * 1024
"""Bytes a header line may take: headers are a few hundred bytes, this is a sanity bound."""
_CHUNK = 64 * 1024


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` as 0700, tightening it if it already exists looser. Missing parents are
    made 0700 too: ``mkdir(parents=True)`` gives them the umask's mode, and a data directory
    made on the way to one of its folders (the PostgreSQL mode's ``state/`` or MCP logs) was
    left 0755."""
    missing: list[Path] = []
    step = path
    while not step.exists() and step.parent != step:
        missing.append(step)
        step = step.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another thread
            folder.mkdir(mode=DIR_MODE)
            folder.chmod(DIR_MODE)  # mkdir's mode passes through the umask
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode != DIR_MODE:
        path.chmod(DIR_MODE)
    return path


def sync_dir(folder: Path) -> None:
    """fsync a folder: a file created, renamed or deleted in it is durable only then."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (``os.write`` may write less); raises ``OSError``."""
    view = memoryview(data)
    written = 0
    while written < len(data):
        n = os.write(fd, view[written:])
        if n == 0:
            raise OSError(errno.EIO, "write returned 0")
        written += n


def open_regular(path: Path, *, follow: bool = False) -> int:
    """A read-only descriptor of the regular file at ``path``.

    Raises :class:`NotARegularFileError` for a directory, FIFO, socket or device, and for a
    symlink unless ``follow`` (an operator naming a path on the command line may mean a link);
    ``FileNotFoundError`` and other ``OSError`` pass through. Never blocks on a FIFO.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise NotARegularFileError(f"{path.name} is a symlink, not a regular file") from exc
        if exc.errno == errno.EISDIR:
            raise NotARegularFileError(f"{path.name} is a directory") from exc
        raise
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotARegularFileError(f"{path.name} is {kind}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, *, follow: bool = False) -> bytes:
    """The whole content of the regular file at ``path`` (see :func:`open_regular`)."""
    fd = open_regular(path, follow=follow)
    try:
        parts: list[bytes] = []
        while chunk := os.read(fd, max(_CHUNK, os.fstat(fd).st_size)):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_first_line(path: Path, limit: int = MAX_FIRST_LINE) -> bytes:
    """The first line of the regular file at ``path`` (without its newline; the whole file
    when it has none), read no further than ``limit`` bytes. A longer first line raises
    :class:`NotARegularFileError` too: nothing we write looks like that."""
    fd = open_regular(path)
    try:
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                return data
            end = chunk.find(b"\n")
            if end != -1:
                return data + chunk[:end]
            data += chunk
        raise NotARegularFileError(f"{path.name} starts with a line over {limit} bytes")
    finally:
        os.close(fd)


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def describe_entry(mode: int) -> str | None:
    """Why an ``lstat`` result is not a session file (a symlink, a FIFO, ...); None if it is."""
    if stat.S_ISLNK(mode):
        return "a symlink, not a regular file"
    kind = _kind(mode)
    return None if kind is None else f"{kind}, not a regular file"
