"""``gateway export``: a session as OTLP/JSON traces (one per turn, with the ids the live
tracer sent) or as JSONL (one request/response record per provider call).

``gateway export ID --format otlp-json|jsonl [--out FILE]`` exports one session (an id, or a
path to a ``.jsonl`` file; with ``--tenant T`` only a log whose header names tenant T); ``--all``
exports every session (every tenant unless ``--tenant``), oldest first, optionally only those
started at or after ``--since DATE`` (``YYYY-MM-DD`` or ISO 8601; a session whose start time is
unknown is left out). Record shapes: :mod:`sessions.export`. ``--content none|metadata|full``
says how much of the conversation they carry; by default as much as live traces do (``full``
with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, else ``none``).

With ``--out``, one line on stdout says what was written where (``wrote 12 records of 3
sessions to FILE``). A ``--tenant`` with no sessions at all is a usage error (a misspelt tenant
used to give an empty file and exit 0).

Read-only for sessions. ``FILE`` and its checkpoint are created 0600 (they hold whole
transcripts, as the logs do). Errors are one line starting ``gateway export:``; exit 2 for usage
errors, 1 when a log is unreadable (``--all`` goes on with the others and exits 1 at the end).

Resuming ``--all --out FILE``
-----------------------------
The checkpoint is ``FILE.progress``, a JSONL file: a first line with the export's options, then
one ``{"session": "<tenant>/<id>", "offset": N}`` line per finished session, where ``N`` is the
size of ``FILE`` once that session's records were all written and fsynced. A session counts as
finished only when its line is in the checkpoint (written, then fsynced, *after* its records).

On start, if ``FILE.progress`` exists, ``FILE`` is cut back to the last recorded offset (so the
records of a session that was being written when the export stopped, whole or partial, are
dropped), finished sessions are skipped and the rest are appended. A crash at any point thus
leaves at most one session's records beyond the last offset, and the next run removes them
first: no duplicates, nothing missing. A torn last checkpoint line is ignored (that session is
simply done again). The checkpoint is deleted when every session was exported; it is kept when
some logs were unreadable, so a rerun retries just those. Rerunning with other options (format,
``--since``, ``--tenant``) than the checkpoint's is refused. Without ``FILE.progress`` an
existing ``FILE`` is overwritten. ``--all`` without ``--out`` writes to stdout and cannot
resume.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, BinaryIO, TextIO, cast

import orjson

from app.commands.common import EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, CommandError
from app.commands.progress import progress
from app.commands.replay import load
from app.version import version
from sessions.errors import InvalidNameError, SessionError
from sessions.export import EXPORT_FORMATS, records, tenant_of
from sessions.files import FILE_MODE
from sessions.genai import CONTENT_LEVELS
from sessions.names import DEFAULT_TENANT
from sessions.replay import Replay, replay_bytes
from sessions.store import SessionInfo, SessionStore

PROG = "gateway export"
DESCRIPTION = """\
A session (or every session, --all) as OTLP/JSON traces that an OpenTelemetry collector's
file receiver reads (one per turn, with the ids the live traces had), or as self-contained
request/response JSONL (one per provider call). Read-only. --all --out FILE is resumable:
rerun the same command after an interruption."""
PROGRESS_SUFFIX = ".progress"
CHECKPOINT_VERSION = 2  # 2: the options name the content level

SessionHook = Callable[[str], None]
"""Called with ``<tenant>/<id>`` after a session's records are written, before its checkpoint
line (tests raise from it to simulate an interruption at the worst moment)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", nargs="?", help="session id, or a path to a .jsonl file")
    parser.add_argument("--all", action="store_true",
                        help="every session (every tenant unless --tenant); resumable with --out")
    parser.add_argument("--since", metavar="DATE",
                        help="with --all: sessions started at/after DATE (YYYY-MM-DD or ISO)")
    parser.add_argument("--format", choices=tuple(EXPORT_FORMATS), required=True,
                        help="otlp-json: OpenTelemetry traces (one TracesData per turn and "
                             "line, GenAI conventions) for a collector's file receiver; jsonl: "
                             "one request/response record per call")
    parser.add_argument("--content", choices=CONTENT_LEVELS, default=None,
                        help="how much of the conversation the records carry: full, metadata "
                             "(tool definitions and the messages' shape, no text) or none "
                             "(default: full when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_"
                             "CONTENT=true, as for live traces, else none)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write here (default: stdout)")
    parser.add_argument("--tenant", default=None,
                        help=f"tenant (default: {DEFAULT_TENANT}; with --all: every tenant)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where sessions live (GATEWAY_DATA_DIR)")


def parse_since(text: str) -> datetime:
    """``YYYY-MM-DD`` (midnight UTC) or an ISO 8601 time (UTC when it names no offset)."""
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise CommandError(f"--since {text!r} is not YYYY-MM-DD or an ISO 8601 time") from exc
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _started(info: SessionInfo) -> datetime | None:
    if info.started_at is None:
        return None
    try:
        moment = datetime.fromisoformat(info.started_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def run(
    args: argparse.Namespace,
    store: SessionStore,
    out: TextIO | None = None,
    err: TextIO | None = None,
    *,
    on_session_written: SessionHook | None = None,
    capture_content: bool = False,
) -> int:
    """Export as ``args`` say; ``capture_content``: the live traces' content setting, which
    ``--content`` defaults to (``full`` when on, else ``none``)."""
    out = out or sys.stdout  # looked up per call, so redirect_stdout works
    err = err or sys.stderr
    shape = Shape(args.format, args.content or ("full" if capture_content else "none"),
                  version())
    if args.all == bool(args.session):
        raise CommandError("give a session id or --all (not both)")
    if args.since is not None and not args.all:
        raise CommandError("--since needs --all")
    if not args.all:
        replay = await load(store, args.session, args.tenant)
        owner = tenant_of(replay, args.tenant or DEFAULT_TENANT)
        if args.tenant is not None and owner != args.tenant:
            # A path can name any file: with --tenant, another tenant's log is not exported
            # (its records would carry the wrong tenant, and it is not this tenant's to give).
            raise CommandError(f"{args.session} belongs to tenant {owner!r}, not {args.tenant!r}")
        with _sink(args.out, out) as write:
            written = _write_session(replay, shape, args.tenant, write)
        if args.out is not None:  # stdout holds no records then: say what went where
            out.write(f"wrote {_count(written, 'record')} of 1 session to {args.out}\n")
        return EXIT_OK
    since = parse_since(args.since) if args.since is not None else None
    todo = await _select(store, args.tenant, since, err)
    tally = Tally()
    if args.out is None:
        return await _export_all(store, todo, shape, _text_writer(out), None, err,
                                 on_session_written, tally)
    options = {"version": CHECKPOINT_VERSION, "format": args.format, "since": args.since,
               "tenant": args.tenant, "content": shape.content}
    checkpoint = Checkpoint(args.out, options)
    done = checkpoint.start()
    try:
        pending = [i for i in todo if _key(i) not in done]
        if done:
            err.write(f"{PROG}: resuming: {len(todo) - len(pending)} of {len(todo)} sessions "
                      f"already in {args.out}\n")
        code = await _export_all(store, pending, shape, checkpoint.write, checkpoint,
                                 err, on_session_written, tally)
    finally:
        checkpoint.close()
    out.write(f"wrote {_count(tally.records, 'record')} of {_count(tally.sessions, 'session')} "
              f"to {args.out}\n")
    if code == EXIT_OK:
        checkpoint.remove()
    else:
        err.write(f"{PROG}: progress kept in {checkpoint.path}; rerun to retry the skipped "
                  "sessions\n")
    return code


def _key(info: SessionInfo) -> str:
    return f"{info.tenant}/{info.session_id}"


async def _select(
    store: SessionStore, tenant: str | None, since: datetime | None, err: TextIO
) -> list[SessionInfo]:
    try:
        infos = await store.list_sessions(tenant)
    except InvalidNameError as exc:
        raise CommandError(str(exc)) from exc
    if tenant is not None and not infos:
        # A misspelt tenant must not pass for an empty one (an empty file, exit 0).
        known = sorted({info.tenant for info in await store.list_sessions(None)})
        raise CommandError(f"no sessions of tenant {tenant!r} (tenants with sessions: "
                           f"{', '.join(known) or 'none'})", EXIT_USAGE)
    infos.reverse()  # oldest first
    if since is None:
        return infos
    unknown = [i for i in infos if _started(i) is None]
    if unknown:
        err.write(f"{PROG}: left out {len(unknown)} session(s) with no readable start time\n")
    return [i for i in infos if (start := _started(i)) is not None and start >= since]


async def _export_all(
    store: SessionStore,
    infos: list[SessionInfo],
    shape: Shape,
    write: Callable[[bytes], None],
    checkpoint: Checkpoint | None,
    err: TextIO,
    hook: SessionHook | None,
    tally: Tally,
) -> int:
    code = EXIT_OK
    with progress("export", len(infos), err) as ticker:
        for info in infos:
            key = _key(info)
            try:
                replay = replay_bytes(await store.read_log(info.tenant, info.session_id))
            except (SessionError, OSError) as exc:
                # One unreadable (or just deleted) log must not stop the export of the others.
                ticker.note(f"{PROG}: skipped {key}: {exc}")
                code = EXIT_UNREADABLE
                ticker.advance()
                continue
            tally.records += _write_session(replay, shape, info.tenant, write)
            tally.sessions += 1
            if checkpoint is not None:
                checkpoint.flush()
            if hook is not None:
                hook(key)
            if checkpoint is not None:
                checkpoint.commit(key)
            ticker.advance()
    return code


@dataclass(frozen=True, slots=True)
class Shape:
    """What the records look like: the format, how much content, the exporter's version."""

    format: str
    content: str
    version: str


@dataclass(slots=True)
class Tally:
    """What an ``--all`` run wrote (this run: a resumed one counts what it added)."""

    sessions: int = 0
    records: int = 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _write_session(
    replay: Replay, shape: Shape, tenant: str | None, write: Callable[[bytes], None]
) -> int:
    """Write the session's records; returns how many."""
    written = 0
    for record in records(replay, shape.format, tenant, content=shape.content,
                          service_version=shape.version):
        write(orjson.dumps(record) + b"\n")
        written += 1
    return written


def _text_writer(out: TextIO) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        out.write(data.decode())

    return write


@contextlib.contextmanager
def _sink(path: Path | None, out: TextIO) -> Iterator[Callable[[bytes], None]]:
    if path is None:
        yield _text_writer(out)
        return
    try:
        fh = private_open(path, "wb")
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror}", EXIT_USAGE) from exc
    def write(data: bytes) -> None:
        fh.write(data)

    with fh:
        yield write


_OPEN_FLAGS = {"wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
               "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "r+b": os.O_RDWR}


def private_open(path: Path, mode: str) -> BinaryIO:
    """Open an export file for writing, created 0600: it holds whole transcripts, as the
    session logs do. An existing regular file is tightened to 0600 as well (never a device or
    a pipe such as ``/dev/stdout``)."""
    fd = os.open(path, _OPEN_FLAGS[mode] | os.O_CLOEXEC, FILE_MODE)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode) and stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
        return cast(BinaryIO, os.fdopen(fd, mode))  # a binary mode gives a binary file
    except BaseException:
        os.close(fd)
        raise


class Checkpoint:
    """``FILE`` and ``FILE.progress`` of a resumable export (see the module docstring)."""

    def __init__(self, out: Path, options: dict[str, Any]) -> None:
        self.out = out
        self.path = out.with_name(out.name + PROGRESS_SUFFIX)
        self.options = options
        self._out: BinaryIO | None = None
        self._log: BinaryIO | None = None

    def start(self) -> set[str]:
        """Open both files (resuming if a checkpoint exists); return the finished sessions."""
        done: set[str] = set()
        offset = 0
        try:
            if self.path.exists():
                done, offset = self._read()
                size = self.out.stat().st_size if self.out.exists() else 0
                if size < offset:
                    raise CommandError(
                        f"{self.out} is shorter than {self.path} records; delete "
                        f"{self.path} to start over"
                    )
                self._out = private_open(self.out, "r+b" if self.out.exists() else "wb")
                self._out.truncate(offset)  # drop what an interrupted run left past the mark
                self._out.seek(offset)
                self._log = private_open(self.path, "ab")
            else:
                self._out = private_open(self.out, "wb")
                self._log = private_open(self.path, "wb")
                self._append_log(self.options)
        except OSError as exc:
            self.close()
            raise CommandError(f"cannot write {exc.filename}: {exc.strerror}",
                               EXIT_USAGE) from exc
        return done

    def _read(self) -> tuple[set[str], int]:
        lines = self.path.read_bytes().split(b"\n")
        try:
            head = orjson.loads(lines[0])
        except orjson.JSONDecodeError:
            head = None
        if head != self.options:
            raise CommandError(
                f"{self.path} belongs to an export with other options ({lines[0].decode()!r}); "
                f"rerun with the same options or delete it to start over"
            )
        done: set[str] = set()
        offset = 0
        for raw in lines[1:]:
            try:
                entry = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # a torn last line: that session is simply exported again
            if isinstance(entry, dict) and isinstance(entry.get("session"), str) \
                    and isinstance(entry.get("offset"), int):
                done.add(entry["session"])
                offset = entry["offset"]
        return done, offset

    def write(self, data: bytes) -> None:
        assert self._out is not None
        self._out.write(data)

    def flush(self) -> None:
        """Make the records written so far durable (before their checkpoint line)."""
        assert self._out is not None
        self._out.flush()
        os.fsync(self._out.fileno())

    def commit(self, key: str) -> None:
        """Record ``key`` as finished at the current end of ``FILE``."""
        assert self._out is not None
        self._append_log({"session": key, "offset": self._out.tell()})

    def _append_log(self, entry: dict[str, Any]) -> None:
        assert self._log is not None
        self._log.write(orjson.dumps(entry) + b"\n")
        self._log.flush()
        os.fsync(self._log.fileno())

    def close(self) -> None:
        for fh in (self._out, self._log):
            if fh is not None:
                fh.close()
        self._out = self._log = None

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
