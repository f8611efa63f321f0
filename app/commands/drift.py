"""``gateway drift``: how each prompt section changed over a session (see ``docs/drift.md``).

Read-only. ``gateway drift ID`` (or a path to a ``.jsonl`` file) prints one row per prompt
version and section; ``--all`` does every session (every tenant unless ``--tenant``) with the
tenant and session id in front of each row. Errors are one line starting ``gateway drift:``;
exit 2 for usage errors (bad metric, unknown session or section), 1 when a log is unreadable
(with ``--all``: after the readable sessions were printed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from app.commands.common import EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, CommandError
from app.commands.progress import progress
from app.commands.replay import load
from sessions import drift as drift_mod
from sessions.cache_bust import cache_busts
from sessions.errors import InvalidNameError, SessionError
from sessions.names import DEFAULT_TENANT
from sessions.replay import Replay, replay_bytes
from sessions.store import SessionStore

PROG = "gateway drift"
DESCRIPTION = """\
How far each section of the system prompt (soul, memory, mood...) moved from one prompt version
to the next in a session, or in every session with --all (a progress bar on stderr). Read-only;
the metrics are explained in docs/drift.md."""
FORMATS = ("table", "json", "csv")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", nargs="?", help="session id, or a path to a .jsonl file")
    parser.add_argument("--all", action="store_true",
                        help="every session (every tenant unless --tenant)")
    parser.add_argument("--section", action="append", metavar="NAME",
                        help="only this section (repeatable; v1/v2 logs have one: prompt)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format")
    parser.add_argument("--metric", default=drift_mod.DEFAULT_METRIC, metavar="NAME",
                        help=f"{', '.join(drift_mod.METRICS)}, or module:function "
                             f"(default: {drift_mod.DEFAULT_METRIC})")
    parser.add_argument("--tenant", default=None,
                        help=f"tenant (default: {DEFAULT_TENANT}; with --all: every tenant)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where sessions live (GATEWAY_DATA_DIR)")


async def run(
    args: argparse.Namespace,
    store: SessionStore,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out = out or sys.stdout  # looked up per call, so redirect_stdout works
    err = err or sys.stderr
    if args.all == bool(args.session):
        raise CommandError("give a session id or --all (not both)")
    try:
        metric = drift_mod.resolve_metric(args.metric)
    except drift_mod.MetricError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    sections: Sequence[str] | None = args.section
    if args.all:
        rows, code = await _all_rows(store, args.tenant, metric, sections, err)
    else:
        replay = await load(store, args.session, args.tenant)
        rows = _rows(replay, metric, sections, None)
        code = EXIT_OK
        if not rows and sections and replay.prompts:
            names = sorted({s.name for v in replay.prompts for s in v.sections})
            raise CommandError(f"session {replay.session_id} has no section named "
                               f"{', '.join(sections)} (it has: {', '.join(names)})")
        if args.format == "table":
            out.write(f"session {replay.session_id}  metric {args.metric}\n")
            if replay.notice:
                out.write(f"notice: {replay.notice}\n")
    _write(rows, args.format, out, with_session=bool(args.all))
    if args.format == "table" and not args.all:
        for bust in cache_busts(replay):
            out.write(f"call {bust.call} (prompt v{bust.version}): {bust.message}"
                      + (" (the stable prefix every conversation shares)" if bust.stable else "")
                      + "\n")
    return code


def _rows(
    replay: Replay,
    metric: drift_mod.Metric,
    sections: Sequence[str] | None,
    prefix: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    try:
        points = drift_mod.drift(replay, metric=metric, sections=sections)
    except drift_mod.MetricError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    return drift_mod.as_dicts(points, prefix)


async def _all_rows(
    store: SessionStore,
    tenant: str | None,
    metric: drift_mod.Metric,
    sections: Sequence[str] | None,
    err: TextIO,
) -> tuple[list[dict[str, Any]], int]:
    try:
        infos = await store.list_sessions(tenant)
    except InvalidNameError as exc:
        raise CommandError(str(exc)) from exc
    rows: list[dict[str, Any]] = []
    code = EXIT_OK
    with progress("drift", len(infos), err) as ticker:
        for info in reversed(infos):  # oldest first: drift reads as a timeline
            name = f"{info.tenant}/{info.session_id}"
            try:
                replay = replay_bytes(await store.read_log(info.tenant, info.session_id))
            except (SessionError, OSError) as exc:
                # One unreadable (or just deleted) log must not hide every other session's.
                ticker.note(f"{PROG}: skipped {name}: {exc}")
                code = EXIT_UNREADABLE
            else:
                rows.extend(_rows(replay, metric, sections,
                                  {"tenant": info.tenant, "session": info.session_id}))
            ticker.advance()
    return rows, code


def _write(rows: list[dict[str, Any]], fmt: str, out: TextIO, *, with_session: bool) -> None:
    if fmt == "json":
        out.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        out.write("\n")
    elif fmt == "csv":
        prefix = ("tenant", "session") if with_session else ()
        out.write(drift_mod.to_csv(rows, (*prefix, *drift_mod.COLUMNS)))
    elif rows:
        out.write(drift_mod.table_text(rows))
    else:
        out.write("(no prompt versions: nothing to compare)\n")
