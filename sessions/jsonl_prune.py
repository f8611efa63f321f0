"""Pruning JSONL session logs by age, safely (``gateway sessions prune``, ``gateway prune``,
the running gateway's retention).

Only ``<data_dir>/sessions/<id>.jsonl`` and ``<data_dir>/tenants/<t>/sessions/<id>.jsonl`` are
ever considered, with valid names, as regular files. Directories are opened with
``O_NOFOLLOW`` and files are looked at with ``lstat``, so a symlink anywhere below the data
directory is skipped, never followed out of the layout. A session a writer holds open (its
``flock``, this process's own writers included) is skipped, not deleted; the lock is held while
unlinking, so a gateway cannot resume the session in between. The log is append-only, so its
modification time is the time of its last entry; a restored backup that lost its mtimes looks
new: the safe direction. Blocking (file system calls): run it in a thread from a loop.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sessions.errors import InvalidNameError
from sessions.names import DEFAULT_TENANT, validate_session_id, validate_tenant
from sessions.store import Pruned

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@dataclass(frozen=True, slots=True)
class SessionFile:
    """One session log found in the layout (``lstat`` data; never a symlink)."""

    tenant: str
    session_id: str
    dir_fd: int
    size: int
    mtime: float
    inode: int


def session_dirs(data_dir: Path, tenant: str | None) -> Iterator[tuple[str, int]]:
    """``(tenant, directory fd)`` of every sessions directory; fds are closed after each yield."""
    try:
        root = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)  # the operator named this one
    except FileNotFoundError:
        return
    except OSError as exc:
        raise NotADirectoryError(exc.errno, f"cannot open {data_dir}: {exc.strerror}") from exc
    try:
        if tenant in (None, DEFAULT_TENANT):
            yield from opened_dir(DEFAULT_TENANT, root, ("sessions",))
        if tenant != DEFAULT_TENANT:
            names = [tenant] if tenant is not None else _tenant_names(root)
            for name in names:
                yield from opened_dir(name, root, ("tenants", name, "sessions"))
    finally:
        os.close(root)


def _tenant_names(root: int) -> list[str]:
    fd = _open_dir(root, ("tenants",))
    if fd is None:
        return []
    try:
        names = []
        with os.scandir(fd) as entries:
            for entry in entries:
                # The default tenant lives in <data_dir>/sessions, never under tenants/.
                if entry.is_dir(follow_symlinks=False) and entry.name != DEFAULT_TENANT:
                    try:
                        names.append(validate_tenant(entry.name))
                    except InvalidNameError:
                        continue
        return sorted(names)
    finally:
        os.close(fd)


def _open_dir(root: int, parts: tuple[str, ...]) -> int | None:
    """Open ``root/parts...`` refusing a symlink at every step; ``None`` if any step is not a
    real directory."""
    fd = root
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    return None
                raise
            if fd != root:
                os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        if fd != root:
            os.close(fd)
        raise


def opened_dir(tenant: str, root: int, parts: tuple[str, ...]) -> Iterator[tuple[str, int]]:
    fd = _open_dir(root, parts)
    if fd is None:
        return
    try:
        yield tenant, fd
    finally:
        os.close(fd)


def session_files(tenant: str, dir_fd: int) -> list[SessionFile]:
    found: list[SessionFile] = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if not entry.name.endswith(".jsonl"):
                continue
            try:
                sid = validate_session_id(entry.name[: -len(".jsonl")])
                st = entry.stat(follow_symlinks=False)
            except (InvalidNameError, FileNotFoundError):
                continue
            if stat.S_ISREG(st.st_mode):  # a symlink or anything odd is not ours to touch
                found.append(SessionFile(tenant, sid, dir_fd, st.st_size, st.st_mtime,
                                         st.st_ino))
    found.sort(key=lambda f: (f.mtime, f.session_id))
    return found


def remove(item: SessionFile, *, dry: bool) -> str | None:
    """Delete one session under its writer lock (``dry``: only take and drop the lock); the
    reason it was (or would be) kept, if it was."""
    name = f"{item.session_id}.jsonl"
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=item.dir_fd)
    except FileNotFoundError:
        return "already gone"
    except OSError as exc:
        return exc.strerror or "cannot open"
    try:
        if os.fstat(fd).st_ino != item.inode:
            return "replaced since it was listed"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "in use by a running gateway"
        if dry:
            return None
        try:
            os.unlink(name, dir_fd=item.dir_fd)
        except OSError as exc:
            return exc.strerror or "cannot delete"
    finally:
        os.close(fd)  # also releases the lock
    return None


def prune(data_dir: Path, cutoffs: Callable[[str], float | None], *,
          tenant: str | None = None, dry: bool = False) -> list[Pruned]:
    """Remove (``dry``: only check) every session of ``tenant`` (``None``: every tenant) last
    modified before its tenant's cutoff; each with ``kept`` saying why one stayed."""
    done: list[Pruned] = []
    for name, dir_fd in session_dirs(data_dir, tenant):
        cutoff = cutoffs(name)
        if cutoff is None:
            continue
        for item in session_files(name, dir_fd):
            if item.mtime >= cutoff:
                break  # sorted oldest first
            done.append(Pruned(item.tenant, item.session_id, item.size, item.mtime,
                               remove(item, dry=dry)))
    return done
