"""``gateway forget --user CHANNEL:ID [--tenant T]``: erase a person, leave a tombstone.

Erases the person's memory scope, their one-to-one session logs (JSONL files or the
PostgreSQL store, ``--store-url``/``GATEWAY_STORE_URL``), their messages in group logs
(replaced by markers), the attachments only they sent, the rerun logs made from those
sessions and the delivery records of their messages (the owed journal's lines, the inbox
rows); prints every thing removed, and records a tombstone so an audit shows the erasure
(``docs/session-format.md``, "Tombstones"). ``--dry-run`` prints what would be removed and
changes nothing. ``--audit`` prints the tombstones (of ``--tenant``, or of every tenant; only
the person's with ``--user``) as JSON lines.

Where the erasure runs (:mod:`gateway.erasure.service`): in the gateway that serves the data
directory, handed to it over its control socket (:mod:`app.control`), which holds the
person's channel still while it erases, so the person stays a user; with several workers
(``GATEWAY_REDIS_URL``), here, after every worker has confirmed it holds still
(:mod:`coordination.redis_erasure`); with no gateway running, here, holding the data
directory's owed journal so none starts meanwhile. Either way nothing is deleted unless the
whole erasure can go ahead: otherwise it says why and exits 1.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import orjson

from app.commands.common import EXIT_OK, EXIT_UNREADABLE, CommandError
from gateway.edge.scopes import ScopeError, parse_ref
from sessions.names import DEFAULT_TENANT
from sessions.tombstones import subject_hash

if TYPE_CHECKING:
    from app.config import Settings
    from sessions.store import SessionStore

DESCRIPTION = """\
Erase a person: what the agent remembers about them, their one-to-one conversations (JSONL
files or the PostgreSQL store), their files, and their messages in group conversations (the
group keeps its log, with a marker in their place), printing each thing removed. A running
gateway does it (it holds the person's conversations still meanwhile, so they can go on
talking to it afterwards); with none running, this command does. A tombstone that names no
content stays, so an audit shows the erasure (--audit prints them). People can do the same
themselves with /forget in a direct message."""


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


ANSWER_TIMEOUT = 300.0
"""Seconds the command waits for the running gateway's answer (its hold waits 30 s at most,
then the erasure reads and rewrites the tenant's logs)."""
ORDER = ("memory", "session", "message", "blob", "rerun", "journal", "inbox", "mcp-log")


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
    request = {"op": "forget", "user": args.user, "tenant": scope.tenant,
               "dry_run": bool(args.dry_run), "requested_by": "operator"}
    answer = await _erase(request, store, settings)
    if not answer.get("ok"):
        raise CommandError(f"nothing was erased: {answer.get('error')}", EXIT_UNREADABLE)
    removed = [(str(kind), str(name)) for kind, name in answer.get("removed") or ()]
    removed.sort(key=lambda r: ORDER.index(r[0]) if r[0] in ORDER else len(ORDER))
    who = f"{scope.channel}:{scope.id} (tenant {scope.tenant})"
    out.write(f"{'would erase' if args.dry_run else 'erased'} {who}:\n")
    for kind, name in removed:
        out.write(f"  {kind:<8} {name}\n")
    # What the other workers emptied of their own (their MCP logs): listed, not counted in
    # the tombstone, which was written before they let go.
    for kind, name in answer.get("elsewhere") or ():
        out.write(f"  {kind!s:<8} {name}\n")
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(Counter(k for k, _ in removed).items()))
    if args.dry_run:
        out.write(f"nothing changed ({counts or 'nothing to remove'})\n")
    else:
        out.write(f"tombstone recorded ({counts or 'nothing was left to remove'})\n")
    return EXIT_OK


async def _erase(request: dict[str, Any], store: SessionStore,
                 settings: Settings) -> dict[str, Any]:
    """Hand the erasure to whoever serves the data (see the module docstring)."""
    from app import control
    from app.compose_erasure import (
        build_eraser,
        cli_bus,
        direct_journal,
        inbox_step,
        mcp_log_step,
    )
    from app.compose_schedule import build_schedule_store
    from app.compose_store import blob_store_for, rerun_store
    from app.erasure_endpoint import run_forget
    from gateway.edge.errors import ConfigError
    from gateway.erasure.service import ErasureService
    from gateway.erasure.steps import OwedStep

    blobs = blob_store_for(store, settings.data_dir)
    reruns = rerun_store(settings.data_dir)
    schedules = build_schedule_store(settings, store)
    try:
        bus = cli_bus(settings)
        if bus is not None:  # several workers: this command holds them all still itself
            service = ErasureService(build_eraser(settings.persona_root, store, None, blobs,
                                                  reruns, inbox_step(store),
                                                  settings.data_dir, schedules), bus=bus.bus,
                                     mcp_servers=mcp_log_step(settings.data_dir, store).servers)
            try:
                return await run_forget(service, request)
            finally:
                await bus.aclose()
        try:
            answer = await control.ask(settings.data_dir, request, ANSWER_TIMEOUT)
        except TimeoutError as exc:
            raise CommandError("the running gateway did not answer in time; see its log",
                               EXIT_UNREADABLE) from exc
        if answer is not None:
            return answer
        try:
            async with direct_journal(settings.data_dir) as journal:
                owed = OwedStep("journal", lambda t, s, i, dry: journal.erase(s, i, dry=dry))
                service = ErasureService(build_eraser(settings.persona_root, store, None, blobs,
                                                      reruns, owed, settings.data_dir,
                                                      schedules))
                return await run_forget(service, request)
        except ConfigError as exc:  # its journal is locked: a gateway runs, deaf to us
            return {"ok": False, "error": f"{exc}; it did not answer on its control socket"}
    finally:
        await reruns.aclose()
        await blobs.aclose()


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
