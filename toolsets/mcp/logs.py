"""What a stdio MCP server writes to stderr, kept capped and rotated under the data folder.

A server's stderr is a pipe the gateway reads (never a file the server writes straight into,
which it could fill without bound): a thread per running server copies it into
``<log_dir>/<server>.log`` (0600, in a 0700 folder). Once that file would pass
:data:`MAX_LOG_BYTES` it becomes ``<server>.log.1`` (the previous ``.1`` becomes ``.2``; the
oldest beyond :data:`KEEP` is dropped), so a server keeps at most ``(KEEP + 1) x MAX_LOG_BYTES``
on disk however much it writes. :func:`log_files` names every file of a server's log: what
erasure empties (a server may have logged what a person's tool calls carried). A file emptied
meanwhile (erasure truncates it while the server runs) is simply written on from its start.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from sessions.files import FILE_MODE, ensure_private_dir

MAX_LOG_BYTES: Final = 1024 * 1024
KEEP: Final = 2
"""Rotated files kept besides the current one."""
_CHUNK: Final = 64 * 1024


def log_name(server: str) -> str:
    """The current log file's name of ``server`` (a server name cannot hold a path)."""
    return f"{server.replace('/', '_')}.log"


def log_files(log_dir: Path, server: str) -> list[Path]:
    """Every file of ``server``'s stderr log that exists: the current one, then the rotated
    ones, newest first."""
    name = log_name(server)
    candidates = [log_dir / name, *(log_dir / f"{name}.{n}" for n in range(1, KEEP + 1))]
    return [path for path in candidates if path.is_file() and not path.is_symlink()]


@contextlib.contextmanager
def stderr_pipe(log_dir: Path | None, server: str) -> Iterator[int]:
    """A file descriptor to give a server process as its stderr; what it writes there lands
    in its capped log (discarded without a ``log_dir``). Leaving closes the gateway's end:
    the copying thread ends once the server's end is closed too (it exited)."""
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    target = None if log_dir is None else _RotatingLog(log_dir, server)
    pump = threading.Thread(target=_copy, args=(read_end, target), daemon=True,
                            name=f"mcp-stderr-{server}")
    pump.start()
    try:
        yield write_end
    finally:
        os.close(write_end)


def _copy(read_end: int, target: _RotatingLog | None) -> None:
    try:
        while chunk := os.read(read_end, _CHUNK):
            if target is not None:
                with contextlib.suppress(OSError):  # a full disk loses log lines, nothing else
                    target.write(chunk)
    finally:
        os.close(read_end)


class _RotatingLog:
    """Appends to ``<server>.log``, rotating it at :data:`MAX_LOG_BYTES` (module docstring).
    Used by one thread."""

    def __init__(self, log_dir: Path, server: str) -> None:
        self.folder = log_dir
        self.path = log_dir / log_name(server)

    def write(self, data: bytes) -> None:
        ensure_private_dir(self.folder)
        for start in range(0, len(data), MAX_LOG_BYTES):
            self._write(data[start:start + MAX_LOG_BYTES])

    def _write(self, data: bytes) -> None:
        fd = self._open()
        try:
            if os.fstat(fd).st_size + len(data) > MAX_LOG_BYTES:
                os.close(fd)
                fd = -1
                self._rotate()
                fd = self._open()
            os.write(fd, data)
        finally:
            if fd >= 0:
                os.close(fd)

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                       | os.O_CLOEXEC, FILE_MODE)

    def _rotate(self) -> None:
        for n in range(KEEP, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            newer = self.path if n == 1 else self.path.with_name(f"{self.path.name}.{n - 1}")
            with contextlib.suppress(FileNotFoundError):
                os.replace(newer, older)
