"""``gateway sessions prune|size``: retention and a size report for the JSONL session layout.

``prune --older-than 30d [--tenant T] [--dry-run]`` removes (or, dry, lists) every session whose
log was last modified longer ago than the duration (units ``s``, ``m``, ``h``, ``d``; a positive
whole number). The log is append-only, so its modification time is the time of its last entry.
A restored backup that lost its mtimes looks new: the safe direction.

``size [--tenant T]`` prints, per tenant, the number of sessions, their bytes and the oldest and
newest last modification.

Safety (:mod:`sessions.jsonl_prune`): only the layout's own session files are considered,
symlinks are never followed, and a session a writer holds open (its ``flock``) is skipped,
not deleted. The JSONL layout only; ``gateway prune`` applies the configured retention
(``GATEWAY_RETENTION_DAYS``) to either store.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from app.commands.common import EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, CommandError
from app.commands.progress import progress
from app.commands.sessions_db import add_subcommands as add_db_subcommands
from sessions.errors import InvalidNameError
from sessions.jsonl_prune import remove, session_dirs, session_files
from sessions.names import validate_tenant

PROG = "gateway sessions"
DESCRIPTION = """\
Retention and moving logs: "prune" deletes sessions not modified for a while (JSONL files;
--dry-run lists them), "size" reports sessions and bytes per tenant, "export-jsonl" and
"import" move logs between JSONL files and the PostgreSQL store."""
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_DURATION = re.compile(r"([0-9]+)([smhd])")


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


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _prune(data_dir: Path, tenant: str | None, seconds: int, dry: bool, out: TextIO,
           err: TextIO) -> int:
    cutoff = time.time() - seconds
    count = total = kept = 0
    verb = "would remove" if dry else "removed"
    for name, dir_fd in session_dirs(data_dir, tenant):
        # Listed first (cheap lstat calls), so the bar knows its length; each file is checked
        # again when it is removed.
        old = [item for item in session_files(name, dir_fd) if item.mtime < cutoff]
        with progress(f"prune {name}", len(old), err) as ticker:
            for item in old:
                ticker.advance()
                label = f"{item.tenant}/{item.session_id}"
                reason = remove(item, dry=dry)
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
    for name, dir_fd in session_dirs(data_dir, tenant):
        files = session_files(name, dir_fd)
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
