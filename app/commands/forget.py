"""``gateway forget --user CHANNEL:ID [--tenant T]``: erase a person, leave a tombstone.

Erases the person's memory scope and their one-to-one session logs (JSONL files or the
PostgreSQL store, ``--store-url``/``GATEWAY_STORE_URL``), prints every thing removed, and
records a tombstone so an audit shows the erasure (``docs/session-format.md``,
"Tombstones"). ``--dry-run`` prints what would be removed and changes nothing. ``--audit``
prints the tombstones (of ``--tenant``, or of every tenant; only the person's with
``--user``) as JSON lines. What is erased, and what is not (group conversations belong to
their chat): :mod:`gateway.erasure.eraser`.

With JSONL sessions, a session a running gateway holds open refuses the erasure before
anything is deleted: stop the gateway first, or let the person send ``/forget`` in a DM.
With PostgreSQL, a worker that has one of the sessions open finds it gone at its next write.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import orjson

from app.commands.common import EXIT_OK, CommandError
from gateway.edge.scopes import ScopeError, parse_ref
from sessions.errors import SessionLockedError
from sessions.names import DEFAULT_TENANT
from sessions.tombstones import subject_hash

if TYPE_CHECKING:
    from app.config import Settings
    from sessions.store import SessionStore

DESCRIPTION = """\
Erase a person: what the agent remembers about them and their one-to-one conversations (JSONL
files or the PostgreSQL store), printing each thing removed. A tombstone that names no content
stays, so an audit shows the erasure (--audit prints them). Group conversations belong to the
group and are kept. People can do the same themselves with /forget in a direct message."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user", metavar="CHANNEL:ID",
                        help="the person, as CHANNEL:ID (telegram:1001, slack:U0ABC, web:CONV)")
    parser.add_argument("--tenant", default=None,
                        help=f"their tenant (default: {DEFAULT_TENANT}; --audit: every tenant)")
    parser.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    parser.add_argument("--audit", action="store_true", help="print the tombstones instead")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="data directory (GATEWAY_DATA_DIR)")
    parser.add_argument("--persona-dir", type=Path, default=None,
                        help="persona workspace (GATEWAY_PERSONA_DIR; default DATA/persona)")


async def run(args: argparse.Namespace, store: SessionStore, settings: Settings,
              out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.audit:
        return await _audit(args, store, out)
    if args.user is None:
        raise CommandError("give --user CHANNEL:ID (or --audit)")
    try:
        scope = parse_ref(args.user, "person", args.tenant or DEFAULT_TENANT)
    except ScopeError as exc:
        raise CommandError(str(exc)) from exc
    from app.compose import blob_store_for, build_eraser, rerun_store

    eraser = build_eraser(settings.persona_root, store,
                          blobs=blob_store_for(store, settings.data_dir),
                          reruns=rerun_store(settings.data_dir))
    who = f"{scope.channel}:{scope.id} (tenant {scope.tenant})"
    if args.dry_run:
        sessions = await eraser.sessions_of(scope)
        out.write(f"would erase {who}: {len(sessions)} one-to-one session(s) and the memory "
                  "scope\n")
        for sid in sessions:
            out.write(f"  session  {sid}\n")
        return EXIT_OK
    try:
        report = await eraser.erase(scope, requested_by="operator")
    except SessionLockedError as exc:
        raise CommandError(f"{exc}: nothing was erased. Stop the gateway first, or let the "
                           "person send /forget in a direct message", 1) from exc
    out.write(f"erased {who}:\n")
    for removal in report.removed:
        out.write(f"  {removal.kind:<8} {removal.name}\n")
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(report.counts().items()))
    out.write(f"tombstone recorded ({counts or 'nothing was left to remove'})\n")
    return EXIT_OK


async def _audit(args: argparse.Namespace, store: SessionStore, out: TextIO) -> int:
    stones = await store.tombstones(args.tenant)
    if args.user is not None:
        try:
            scope = parse_ref(args.user, "person", args.tenant or DEFAULT_TENANT)
        except ScopeError as exc:
            raise CommandError(str(exc)) from exc
        wanted = subject_hash(scope.tenant, scope.channel, scope.id)
        stones = [s for s in stones if isinstance(s.get("subject"), dict)
                  and s["subject"].get("sha256") == wanted]
    for stone in stones:
        out.write(orjson.dumps(stone).decode() + "\n")
    return EXIT_OK
