"""``gateway usage``: tokens and cost, by conversation, person, tenant, model or day.

Read-only. Reads the session logs (every tenant unless ``--tenant``), takes every call with an
outcome since ``--since``, and adds them up (:mod:`sessions.usage`). Costs are the ones
recorded at call time; calls recorded without one are priced with the table in force
(``GATEWAY_PRICES_FILE``) when it knows their model. Errors are one line starting
``gateway usage:``; exit 2 for usage errors, 1 when a log was unreadable (after the totals of
the readable ones).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

import orjson

from app.commands.common import EXIT_OK, EXIT_UNREADABLE, CommandError
from sessions.errors import SessionError
from sessions.pricing import PriceTable
from sessions.replay import replay_bytes
from sessions.store import SessionStore
from sessions.usage import BY, By, CallUsage, UsageRow, aggregate, calls_of, matches_user, total

PROG = "gateway usage"
DESCRIPTION = """\
Tokens and cost of the provider calls in the session logs, added up by conversation, person
(--by user), tenant, model or day. Costs are those recorded when each call was made, by the
price table then in force (see GATEWAY_PRICES_FILE)."""
FORMATS = ("table", "json", "csv")
_SINCE = re.compile(r"^(\d+)([dhm])$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", default=None, help="only this tenant (default: every one)")
    parser.add_argument("--user", action="append", metavar="ID",
                        help="only calls for this person: CHANNEL:ID or a bare platform id "
                             "(repeatable)")
    parser.add_argument("--since", default=None, metavar="WHEN",
                        help="only calls since: 7d, 12h, 30m, or a date (2026-11-01) or UTC "
                             "time (default: every call)")
    parser.add_argument("--by", choices=BY, default="conversation",
                        help="what to add up by (default: conversation)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where sessions live (GATEWAY_DATA_DIR)")


def since_of(text: str | None, now: datetime) -> datetime | None:
    """``--since`` as a UTC time: ``7d``/``12h``/``30m`` before ``now``, or an ISO date/time."""
    if text is None:
        return None
    found = _SINCE.match(text.strip())
    if found:
        return now - timedelta(**{_UNITS[found.group(2)]: int(found.group(1))})
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise CommandError(f"--since {text!r}: give 7d, 12h, 30m, or a date like "
                           "2026-11-01") from exc
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


async def collect(store: SessionStore, prices: PriceTable, *, tenant: str | None,
                  since: datetime | None, users: Sequence[str] | None,
                  err: TextIO) -> tuple[list[CallUsage], int]:
    """Every matching call in the store, and how many logs could not be read."""
    calls: list[CallUsage] = []
    unreadable = 0
    cutoff = since.strftime("%Y-%m-%dT%H:%M:%S") if since is not None else None
    for info in await store.list_sessions(tenant):
        if since is not None and info.modified < since.timestamp():
            continue  # nothing in it was written after the cutoff
        try:
            replay = replay_bytes(await store.read_log(info.tenant, info.session_id))
        except (SessionError, OSError) as exc:
            unreadable += 1
            err.write(f"{PROG}: skipped {info.tenant}/{info.session_id}: {exc}\n")
            continue
        for call in calls_of(replay, prices):
            if cutoff is not None and (call.ts is None or call.ts < cutoff):
                continue
            if users and not matches_user(call, users):
                continue
            calls.append(call)
    return calls, unreadable


async def run(args: argparse.Namespace, store: SessionStore, prices: PriceTable,
              out: TextIO | None = None, err: TextIO | None = None,
              now: datetime | None = None) -> int:
    out = out or sys.stdout  # looked up per call, so redirect_stdout works
    err = err or sys.stderr
    since = since_of(args.since, now or datetime.now(UTC))
    calls, unreadable = await collect(store, prices, tenant=args.tenant, since=since,
                                      users=args.user, err=err)
    by: By = args.by
    rows = aggregate(calls, by)
    if args.format == "json":
        doc = {"by": by, "since": since.isoformat() if since else None,
               "rows": [r.to_json() for r in rows], "total": total(rows).to_json()}
        out.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.format == "csv":
        _csv(rows, by, out)
    else:
        _table(rows, by, since, out)
    if unreadable:
        raise CommandError(f"{unreadable} session log(s) could not be read", EXIT_UNREADABLE)
    return EXIT_OK


_COLUMNS = ("calls", "input", "cache write", "cache read", "output", "cost USD")


def _cells(row: UsageRow) -> list[str]:
    cost = f"{row.cost_usd:.4f}" + (f" (+{row.unpriced} unpriced)" if row.unpriced else "")
    return [str(row.calls), f"{row.input_tokens:,}", f"{row.cache_write:,}",
            f"{row.cache_read:,}", f"{row.output_tokens:,}", cost]


def _table(rows: Sequence[UsageRow], by: By, since: datetime | None, out: TextIO) -> None:
    span = f"since {since:%Y-%m-%d %H:%M} UTC" if since else "all time"
    if not rows:
        out.write(f"no provider calls ({span})\n")
        return
    body = [[r.key, *_cells(r)] for r in rows]
    body.append(["total", *_cells(total(rows))])
    head = [by, *_COLUMNS]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    out.write(f"usage by {by}, {span}\n")
    for n, line in enumerate([head, *body]):
        if n == len(body):  # the total, under a rule
            out.write("  ".join("-" * w for w in widths) + "\n")
        cells = [line[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(line[1:], widths[1:],
                                                                          strict=True)]
        out.write("  ".join(cells).rstrip() + "\n")


def _csv(rows: Sequence[UsageRow], by: By, out: TextIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([by, "calls", "sessions", "input_tokens", "cache_write_tokens",
                     "cache_read_tokens", "output_tokens", "cost_usd", "unpriced_calls"])
    for row in rows:
        doc = row.to_json()
        writer.writerow([doc["key"], doc["calls"], doc["sessions"], doc["input_tokens"],
                         doc["cache_write_tokens"], doc["cache_read_tokens"],
                         doc["output_tokens"], f"{row.cost_usd:.6f}", doc["unpriced_calls"]])
