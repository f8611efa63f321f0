"""Persona files on disk: private atomic writes, bounded stamped reads, directory scans.

Everything here blocks and is called from worker threads, except :func:`scan` (see its
docstring). Files are ``0600``, directories ``0700``; symlinks are never followed: what is in
these files goes to a third-party provider, so only regular files the workspace can see in its
own directories are read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

from sessions.files import ensure_private_dir

log = logging.getLogger(__name__)

Stamp: TypeAlias = tuple[int, int, int]
"""``(st_mtime_ns, st_size, st_ino)`` of a file: what tells a change without reading it."""

NO_STAMP: Stamp = (-1, -1, -1)
MAX_READ_BYTES = 1 << 20
"""Files are read up to this many bytes: an operator's stray huge file cannot eat the heap."""


def atomic_write(path: Path, text: str, *, base: Path | None = None) -> Stamp:
    """Write ``text`` to ``path`` atomically with mode 0600; returns the new file's stamp.

    Missing directories are created 0700, each of them (from ``base`` down, when given).
    """
    ensure_dir(path.parent, base=base)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must survive a crash
    finally:
        os.close(dir_fd)
    st = os.lstat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def ensure_dir(path: Path, *, base: Path | None = None) -> None:
    """Create ``path`` with mode 0700 if it does not exist; with ``base``, every missing
    directory between ``base`` and ``path`` is made 0700 too (``mkdir(parents=True)`` would
    give them the umask's mode)."""
    if path.is_dir():
        return
    chain = [path]
    if base is not None:
        chain = [p for p in reversed(path.relative_to(base).parents) if str(p) != "."]
        chain = [base, *(base / p for p in chain), path]
    for directory in chain:
        if not directory.is_dir():
            ensure_private_dir(directory)  # its missing parents (the data folder) too


def read_text(path: Path) -> str:
    """A file's text, or ``""`` when it does not exist."""
    try:
        return read(path)[1]
    except FileNotFoundError:
        return ""


def read(path: Path) -> tuple[Stamp, str]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        # Stamp before reading: if the file changes mid-read, the next scan sees a newer
        # stamp than ours and reads it again.
        st = os.fstat(f.fileno())
        data = f.read(MAX_READ_BYTES)
    return (st.st_mtime_ns, st.st_size, st.st_ino), data.decode("utf-8", errors="replace")


def read_files(root: Path, keys: Sequence[str]) -> dict[str, tuple[Stamp, str]]:
    """``key -> (stamp, text)``; an unreadable file is logged once and reads as empty."""
    out: dict[str, tuple[Stamp, str]] = {}
    for key in keys:
        try:
            out[key] = read(root / key)
        except OSError as exc:
            log.warning("persona file %s unreadable: %s", key, exc.strerror or type(exc).__name__)
            out[key] = (NO_STAMP, "")
    return out


Targets: TypeAlias = tuple[tuple[str, str], ...]
"""``(directory, key prefix)`` pairs a layer scans: its root first (prefix ``""``), then each
subdirectory (prefix ``"name/"``). Paths are plain strings, made once per layer: the scan runs
on every prompt build, and joining paths anew each time cost more than the system calls."""


def scan_targets(root: Path, dirs: Sequence[str]) -> Targets:
    return ((str(root), ""), *((str(root / d), f"{d}/") for d in dirs))


def scan(targets: Targets, files: frozenset[str]) -> dict[str, Stamp]:
    """Stamp the tracked files: ``files`` in the root, and ``*.md`` in each subdirectory.

    Runs on the event loop on purpose: one ``scandir`` per directory and one ``lstat`` per
    file cost a few microseconds per file on a local disk (about 1 ms with 200 kb notes),
    cheaper than a hop to a worker thread for the usual handful of files, and this is what
    lets every build see every change.
    """
    stamps: dict[str, Stamp] = {}
    for directory, prefix in targets:
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    name = entry.name
                    if prefix:
                        if not name.endswith(".md") or name.startswith("."):
                            continue
                    elif name not in files:
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        stamps[prefix + name] = (st.st_mtime_ns, st.st_size, st.st_ino)
        except (FileNotFoundError, NotADirectoryError):
            if not prefix:
                return stamps  # no layer directory (most tenants, new scopes): nothing below
            continue
    return stamps


def remove_tree(path: Path) -> list[str]:
    """Delete the directory ``path`` and everything in it; returns the files removed
    (relative to ``path``, sorted). A missing directory removes nothing. Symlinks inside are
    removed as links, never followed."""
    if not path.is_dir() or path.is_symlink():
        return []
    removed = sorted(p.relative_to(path).as_posix() for p in path.rglob("*")
                     if p.is_file() or p.is_symlink())
    shutil.rmtree(path)
    return removed
