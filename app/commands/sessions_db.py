"""``gateway sessions export-jsonl|import``: move session logs between JSONL files and a store.

``export-jsonl ID [--tenant T] [--out FILE]`` writes a session's log, byte for byte as the
store holds it, to ``FILE`` (created 0600, never overwritten) or to stdout. Its replay equals
the store's replay: for a PostgreSQL store the file is the database rows' lines in ``seq``
order. A session keeps its format version (a v3 session exports as v3; an imported v1/v2 log
exports as it was imported).

``import FILE... [--tenant T]`` loads JSONL logs, v1/v2 seed logs included, into the PostgreSQL
store, keeping every line byte for byte (a line without ``seq`` gets its line index). The
session id is the header's ``id`` or else the file name. A torn last line is skipped and
reported. A file that cannot be imported (exists already, a ``seq`` gap, no header...) is
reported and the others go on; the exit code is then 1.

The store is ``--store-url`` or ``GATEWAY_STORE_URL`` (export also reads the JSONL store).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import BinaryIO, TextIO

from app.commands.common import EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, CommandError
from app.commands.db import add_schema_argument
from app.commands.progress import progress
from sessions.errors import InvalidNameError, SessionError, SessionNotFoundError
from sessions.files import read_regular
from sessions.names import DEFAULT_TENANT, validate_session_id, validate_tenant
from sessions.store import LogImporter, SessionStore

ACTIONS = ("export-jsonl", "import")
FILE_MODE = 0o600


def add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``export-jsonl`` and ``import`` on the ``gateway sessions`` sub-parsers."""
    export = sub.add_parser("export-jsonl", help="write a session's log as a JSONL file")
    export.add_argument("session", help="session id")
    export.add_argument("--out", type=Path, default=None,
                        help="file to create (default: stdout); an existing file is kept")
    load = sub.add_parser("import", help="load JSONL logs (v1/v2/v3) into the PostgreSQL store")
    load.add_argument("files", nargs="+", type=Path, metavar="FILE")
    for p in (export, load):
        p.add_argument("--tenant", default=DEFAULT_TENANT,
                       help=f"tenant (default: {DEFAULT_TENANT})")
        p.add_argument("--store-url", default=None,
                       help="postgresql:// URL of the store (default: GATEWAY_STORE_URL)")
        add_schema_argument(p)
        p.add_argument("--data-dir", type=Path, default=None,
                       help="JSONL store when no database is given (GATEWAY_DATA_DIR)")


async def run(
    args: argparse.Namespace,
    store: SessionStore,
    out: TextIO | None = None,
    err: TextIO | None = None,
    binary_out: BinaryIO | None = None,
) -> int:
    out = out or sys.stdout  # looked up per call, so redirect_stdout works
    err = err or sys.stderr
    try:
        tenant = validate_tenant(args.tenant)
    except InvalidNameError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    if args.action == "export-jsonl":
        return await _export(store, tenant, args.session, args.out,
                             binary_out or sys.stdout.buffer, err)
    return await _import(store, tenant, args.files, out, err)


async def _export(store: SessionStore, tenant: str, session: str, target: Path | None,
                  stdout: BinaryIO, err: TextIO) -> int:
    try:
        data = await store.read_log(tenant, validate_session_id(session))
    except (InvalidNameError, SessionNotFoundError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    except OSError as exc:
        raise CommandError(f"cannot read session {session}: {exc.strerror or exc}",
                           EXIT_UNREADABLE) from exc
    if target is None:
        stdout.write(data)
        stdout.flush()
        return EXIT_OK
    try:
        await asyncio.to_thread(_write_new, target, data)
    except FileExistsError as exc:
        raise CommandError(f"{target} exists; not overwritten", EXIT_USAGE) from exc
    except OSError as exc:
        raise CommandError(f"cannot write {target}: {exc.strerror}", EXIT_UNREADABLE) from exc
    lines = data.count(b"\n")
    err.write(f"wrote {target}: {lines} lines, {len(data)} bytes\n")
    return EXIT_OK


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)  # no half-written export left behind
        raise
    os.close(fd)


async def _import(store: SessionStore, tenant: str, files: list[Path], out: TextIO,
                  err: TextIO) -> int:
    if not isinstance(store, LogImporter):
        raise CommandError("import needs a PostgreSQL store: give --store-url or set "
                           "GATEWAY_STORE_URL", EXIT_USAGE)
    failed = 0
    with progress("import", len(files), err) as ticker:
        for path in files:
            ticker.advance()
            try:
                data = await asyncio.to_thread(read_regular, path, follow=True)
                result = await store.import_log(tenant, data, fallback_id=path.stem)
            except (SessionError, OSError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                ticker.note(f"gateway sessions import: {path}: {reason}")
                failed += 1
                continue
            version = f"v{result.version}" if result.version is not None else "v1"
            out.write(f"imported {path} as {result.tenant}/{result.session_id} ({version}, "
                      f"{result.entries} lines, {result.size_bytes} bytes)\n")
            if result.torn_bytes:
                out.write(f"  skipped a torn last line ({result.torn_bytes} bytes)\n")
    return EXIT_UNREADABLE if failed else EXIT_OK
