"""``gateway schedule list|add|show|cancel``: the operator's side of scheduled turns.

Reads the same settings as ``gateway run`` (the schedules live with its sessions: the
``schedules`` table of ``GATEWAY_STORE_URL``, else ``<data>/state/schedules.jsonl``), so a
schedule added here is fired by the running gateway (within ``GATEWAY_SCHEDULE_POLL``), by
exactly one of its workers. An operator's schedule speaks in a shared conversation
(``--chat slack:C0123``) or to a person (``--to slack:U0123``: the channel opens the direct
chat when it fires; Telegram only writes to people who have talked to the bot).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import orjson

from app.commands.common import EXIT_OK, CommandError

if TYPE_CHECKING:
    from app.config import Settings
    from gateway.schedule.service import Schedules
    from sessions.schedules import ScheduleRecord, Target
    from sessions.store import SessionStore

DESCRIPTION = """\
List, add, show and cancel scheduled turns: reminders people set in chat and the operator's
own schedules. When one fires, the agent is given its instruction in its conversation and
answers there; the turn is recorded like any other."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="data directory (GATEWAY_DATA_DIR)")
    parser.add_argument("--tenant", default=None, help="tenant (default: default; list: all)")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="active schedules (--all: ended ones too)")
    listing.add_argument("--all", action="store_true", help="also done and cancelled ones")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    add = sub.add_parser("add", help="add an operator's schedule")
    where = add.add_mutually_exclusive_group(required=True)
    where.add_argument("--chat", metavar="CHANNEL:CHAT[:THREAD]",
                       help="a shared conversation (slack:C0123, telegram:-100123)")
    where.add_argument("--to", metavar="CHANNEL:PERSON",
                       help="a person's direct chat (slack:U0123, telegram:1001)")
    add.add_argument("--say", required=True, metavar="INSTRUCTION",
                     help="what the agent is given when it fires")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--when", help="once: '2026-03-11 09:00', 'tomorrow 9:00', 'in 2h'")
    when.add_argument("--every", help="an interval: 30m, 2h, 1d (first one after it)")
    when.add_argument("--cron", help="five fields: '0 9 * * 1-5'")
    add.add_argument("--zone", default=None,
                     help="the time zone it is read in (default: the tenant's)")
    show = sub.add_parser("show", help="one schedule, with its last outcomes (JSON)")
    show.add_argument("id")
    cancel = sub.add_parser("cancel", help="cancel a schedule")
    cancel.add_argument("id")
    for action in (listing, add, show, cancel):  # before or after the action, as people type it
        action.add_argument("--tenant", default=argparse.SUPPRESS,
                            help="tenant (a Slack workspace: its team id, T...)")


async def run(args: argparse.Namespace, store: SessionStore, settings: Settings,
              out: TextIO | None = None) -> int:
    from app.compose_schedule import build_schedule_store, schedule_settings
    from gateway.schedule.clock import SystemClock
    from gateway.schedule.service import Schedules

    out = out or sys.stdout
    schedules = Schedules(build_schedule_store(settings, store), schedule_settings(settings),
                          SystemClock())
    try:
        if args.action == "list":
            return await _list(args, schedules, out)
        if args.action == "add":
            return await _add(args, schedules, out)
        tenant = args.tenant or "default"
        if args.action == "show":
            found = await schedules.store.get(tenant, args.id)
            if found is None:
                raise CommandError(f"no schedule {args.id!r} in tenant {tenant}")
            out.write(_json(found) + "\n")
            return EXIT_OK
        cancelled = await schedules.cancel(tenant, args.id, None)
        if cancelled is None:
            raise CommandError(f"no active schedule {args.id!r} in tenant {tenant}")
        out.write(f"cancelled {cancelled.id}: {cancelled.instruction}\n")
        return EXIT_OK
    finally:
        await schedules.store.aclose()


async def _list(args: argparse.Namespace, schedules: Schedules, out: TextIO) -> int:
    from gateway.schedule import triggers

    found = await schedules.store.find(args.tenant, active_only=not args.all)
    if args.json:
        for record in found:
            out.write(_json(record) + "\n")
        return EXIT_OK
    if not found:
        out.write("(no schedules)\n")
        return EXIT_OK
    now = schedules.clock.now()
    for r in found:
        out.write(f"{r.id}  {r.tenant}  {r.state}  {r.target.label()}  owner {r.owner}  by "
                  f"{r.created_by}  fired {r.fired}  skipped {r.skipped}\n"
                  f"    {triggers.describe(r, now)}\n")
        if r.firing is not None and r.held_until is not None:
            out.write(f"    held until {triggers.local_words(r.held_until, triggers.zone(r.zone))}"
                      f" ({r.zone}): {r.held_reason or 'held'}\n")
        out.write(f"    {r.instruction}\n")
    return EXIT_OK


async def _add(args: argparse.Namespace, schedules: Schedules, out: TextIO) -> int:
    from app.compose_schedule import schedule_tenant_problem
    from gateway.schedule.service import OPERATOR, TENANT_OWNER
    from gateway.schedule.triggers import TriggerError
    from sessions.schedules import ScheduleLimitError

    tenant = args.tenant or "default"
    target = _target(args.chat, args.to)
    problem = schedule_tenant_problem(target.channel, tenant)
    if problem is not None:
        raise CommandError(f"{problem}: add --tenant T0123")
    zone = args.zone or await schedules.zone_for(tenant, None)
    try:
        record = await schedules.create(
            tenant=tenant, owner=TENANT_OWNER, target=target, created_by=OPERATOR,
            instruction=args.say, when=args.when, every=args.every, cron=args.cron, zone=zone,
            operator=True)
    except (TriggerError, ScheduleLimitError) as exc:
        raise CommandError(str(exc)) from exc
    out.write(f"added {schedules.words(record)}\n    to {target.label()} (tenant {tenant})\n")
    return EXIT_OK


def _target(chat: str | None, to: str | None) -> Target:
    from sessions.schedules import Target

    text = chat or to or ""
    channel, sep, rest = text.partition(":")
    if not sep or not channel or not rest:
        raise CommandError(f"{text!r} is not CHANNEL:ID (e.g. slack:C0123, telegram:1001)")
    if to is not None:
        return Target(channel, "", "private", None, rest)
    conversation, _, thread = rest.partition(":")
    return Target(channel, conversation, "group", thread or None, None)


def _json(record: ScheduleRecord) -> str:
    from sessions.schedules import to_json

    return orjson.dumps(to_json(record)).decode()
