"""Rewriting lines of a JSONL session in place (an erasure's markers in a group's log), and
reading a whole open file: blocking, for a thread (:mod:`sessions.jsonl` runs them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sessions.encoding import loads_entry
from sessions.files import FILE_MODE, write_all


def rewrite_lines(path: Path, fd: int, lines: Mapping[int, bytes]) -> None:
    """Replace the lines of ``path`` (open as ``fd``) whose ``seq`` is in ``lines``: a new file
    written beside it, fsynced, renamed over it (a crash leaves the old file or the new one)."""
    data = read_fd(fd)
    out: list[bytes] = []
    for raw in data.split(b"\n"):
        if raw and b'"seq"' in raw:
            entry = loads_entry(raw)
            seq = entry.get("seq") if entry is not None else None
            if isinstance(seq, int) and seq in lines:
                raw = lines[seq]
        out.append(raw)
    temporary = path.with_name(f".{path.name}.erase")
    new = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    try:
        write_all(new, b"\n".join(out))
        os.fsync(new)
    except BaseException:
        os.close(new)
        temporary.unlink(missing_ok=True)
        raise
    os.close(new)
    os.replace(temporary, path)


def read_fd(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0)
