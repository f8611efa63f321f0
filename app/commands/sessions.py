"""``gateway sessions prune|size``: retention and a size report for the JSONL session layout.

``prune --older-than 30d [--tenant T] [--dry-run]`` removes (or, dry, lists) every session whose
log was last modified longer ago than the duration (units ``s``, ``m``, ``h``, ``d``; a positive
whole number). The log is append-only, so its modification time is the time of its last entry.
A restored backup that lost its mtimes looks new: the safe direction.

``size [--tenant T]`` prints, per tenant, the number of sessions, their bytes and the oldest and
newest last modification.

Safety: only ``<data_dir>/sessions/<id>.jsonl`` and ``<data_dir>/tenants/<t>/sessions/<id>.jsonl``
are ever considered, with valid names, as regular files. Directories are opened with
``O_NOFOLLOW`` and files are looked at with ``lstat``, so a symlink anywhere below the data
directory is skipped, never followed out of the layout. A session another process holds open
for writing (its ``flock``) is skipped, not deleted; the lock is held while unlinking, so a
gateway cannot resume the session in between. The JSONL layout only: another store backend
needs its own retention.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from app.commands.common import EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, CommandError
from app.commands.progress import progress
from app.commands.sessions_db import add_subcommands as add_db_subcommands
from sessions.errors import InvalidNameError
from sessions.names import DEFAULT_TENANT, validate_session_id, validate_tenant

PROG = "gateway sessions"
DESCRIPTION = """\
Retention and moving logs: "prune" deletes sessions not modified for a while (JSONL files;
--dry-run lists them), "size" reports sessions and bytes per tenant, "export-jsonl" and
"import" move logs between JSONL files and the PostgreSQL store."""
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_DURATION = re.compile(r"([0-9]+)([smhd])")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    prune = sub.add_parser("prune", help="delete sessions not modified for a while")
    prune.add_argument("--older-than", required=True, metavar="AGE",
                       help="e.g. 30d, 12h, 90m, 3600s")
    prune.add_argument("--dry-run", action="store_true", help="list, delete nothing")
    size = sub.add_parser("size", help="sessions, bytes, oldest and newest per tenant")
    for p in (prune, size):
        p.add_argument("--tenant", default=None, help="only this tenant (default: every tenant)")
        p.add_argument("--data-dir", type=Path, default=None,
                       help="where sessions live (GATEWAY_DATA_DIR)")
    add_db_subcommands(sub)  # export-jsonl, import (app/commands/sessions_db.py)


def parse_duration(text: str) -> int:
    """Seconds in ``<positive integer><s|m|h|d>``; anything else is a usage error."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise CommandError(
            f"--older-than {text!r}: give a positive whole number and a unit s, m, h or d "
            "(e.g. 30d)", EXIT_USAGE)
    return int(match.group(1)) * UNITS[match.group(2)]


@dataclass(frozen=True, slots=True)
class SessionFile:
    """One session log found in the layout (``lstat`` data; never a symlink)."""

    tenant: str
    session_id: str
    dir_fd: int
    size: int
    mtime: float
    inode: int


def run(args: argparse.Namespace, data_dir: Path, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    """Blocking by design: a one-shot command with nothing else on its event loop."""
    out = out or sys.stdout  # looked up per call, so redirect_stdout works
    err = err or sys.stderr
    if args.tenant is not None:
        try:
            validate_tenant(args.tenant)
        except InvalidNameError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
    try:
        if args.action == "prune":
            seconds = parse_duration(args.older_than)
            return _prune(data_dir, args.tenant, seconds, args.dry_run, out, err)
        return _size(data_dir, args.tenant, out)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        raise CommandError(f"cannot read{where}: {exc.strerror}", EXIT_UNREADABLE) from exc


def _session_dirs(data_dir: Path, tenant: str | None) -> Iterator[tuple[str, int]]:
    """``(tenant, directory fd)`` of every sessions directory; fds are closed after each yield."""
    try:
        root = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)  # the operator named this one
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CommandError(f"cannot open {data_dir}: {exc.strerror}", EXIT_USAGE) from exc
    try:
        if tenant in (None, DEFAULT_TENANT):
            yield from _opened(DEFAULT_TENANT, root, ("sessions",))
        if tenant != DEFAULT_TENANT:
            names = [tenant] if tenant is not None else _tenant_names(root)
            for name in names:
                yield from _opened(name, root, ("tenants", name, "sessions"))
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


def _opened(tenant: str, root: int, parts: tuple[str, ...]) -> Iterator[tuple[str, int]]:
    fd = _open_dir(root, parts)
    if fd is None:
        return
    try:
        yield tenant, fd
    finally:
        os.close(fd)


def _files(tenant: str, dir_fd: int) -> list[SessionFile]:
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


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _remove(item: SessionFile, *, dry: bool) -> str | None:
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


def _prune(data_dir: Path, tenant: str | None, seconds: int, dry: bool, out: TextIO,
           err: TextIO) -> int:
    cutoff = time.time() - seconds
    count = total = kept = 0
    verb = "would remove" if dry else "removed"
    for name, dir_fd in _session_dirs(data_dir, tenant):
        # Listed first (cheap lstat calls), so the bar knows its length; each file is checked
        # again when it is removed.
        old = [item for item in _files(name, dir_fd) if item.mtime < cutoff]
        with progress(f"prune {name}", len(old), err) as ticker:
            for item in old:
                ticker.advance()
                label = f"{item.tenant}/{item.session_id}"
                reason = _remove(item, dry=dry)
                if reason is not None:
                    out.write(f"{'would keep' if dry else 'kept'} {label}: {reason}\n")
                    kept += 1
                    continue
                out.write(f"{verb} {label}  {item.size} bytes  "
                          f"last modified {_iso(item.mtime)}\n")
                count += 1
                total += item.size
    out.write(f"{verb} {count} session(s), {total} bytes")
    out.write(f"; {'would keep' if dry else 'kept'} {kept} in use or changed\n" if kept else "\n")
    return EXIT_OK


def _size(data_dir: Path, tenant: str | None, out: TextIO) -> int:
    header = ("tenant", "sessions", "bytes", "oldest", "newest")
    rows: list[tuple[str, ...]] = []
    all_count = all_bytes = 0
    for name, dir_fd in _session_dirs(data_dir, tenant):
        files = _files(name, dir_fd)
        size = sum(f.size for f in files)
        all_count += len(files)
        all_bytes += size
        oldest = _iso(files[0].mtime) if files else "-"
        newest = _iso(files[-1].mtime) if files else "-"
        rows.append((name, str(len(files)), str(size), oldest, newest))
    rows.append(("total", str(all_count), str(all_bytes), "", ""))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        cells = [
            cell.rjust(w) if i in (1, 2) else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.write("  ".join(cells).rstrip() + "\n")
    return EXIT_OK
