"""The model's schedule tools: ``schedule_create``, ``schedule_list``, ``schedule_cancel``.

Each works in the conversation's own scope only (:mod:`gateway.schedule.service`): a reminder
set in a person's one-to-one chat is theirs and fires there; one set in a group is the
group's and fires in that group (in that thread or topic). There is no argument naming
another conversation or person. Times are read in the zone of the person who asks, and every
answer says them back in words (day, date, time, zone, how long from now), for the model to
confirm to the person. The descriptions are fixed text (they are part of the recorded tool
set); what changes (the time now) is in the results, which are recorded too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.edge.errors import ToolError
from gateway.edge.messages import ChannelContext
from gateway.edge.scopes import ONE_TO_ONE, scope_of
from gateway.edge.tools import Tool, ToolResult
from gateway.schedule import triggers
from gateway.schedule.service import MAX_INSTRUCTION_CHARS, Schedules
from sessions.schedules import ScheduleLimitError, Target, person_owner


def owner_of(context: ChannelContext) -> str:
    """The conversation's owner scope: ``person:CHANNEL:ID`` or ``chat:CHANNEL:ID``."""
    scope = scope_of(context)
    return f"{scope.kind}:{scope.channel}:{scope.id}"


def target_of(context: ChannelContext) -> Target:
    private = context.chat_type == ONE_TO_ONE
    return Target(context.channel, context.chat, context.chat_type, context.thread,
                  context.person if private else None)


def person_of(context: ChannelContext) -> str | None:
    return f"{context.channel}:{context.person}" if context.person else None


class _Base:
    server = "gateway"

    def __init__(self, schedules: Schedules) -> None:
        self.schedules = schedules

    @property
    def remote_name(self) -> str:
        return str(getattr(self, "name", ""))

    async def _now_line(self, context: ChannelContext) -> str:
        zone = await self.schedules.zone_for(context.tenant, person_of(context))
        now = self.schedules.clock.now()
        return f"It is now {triggers.local_words(now, triggers.zone(zone))} ({zone})."


class ScheduleCreate(_Base):
    name = "schedule_create"
    description = (
        "Set a reminder or a recurring task in this conversation: when it fires you are given "
        "the instruction and answer here, as if asked. Give exactly one of: when (one time: "
        "'tomorrow 9:00', 'friday 18:30', '2026-03-11 09:00', '9am', 'in 2 hours'), every (an "
        "interval such as '1d' or '2h', optionally with when for the first time) or cron "
        "(five fields, e.g. '0 9 * * 1-5'). Times are the person's local time. Confirm the "
        "time the result states back to the person in words."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "instruction": {"type": "string", "maxLength": MAX_INSTRUCTION_CHARS,
                            "description": "what to do when it fires, e.g. 'Remind Ada to "
                                           "call the bank'"},
            "when": {"type": "string", "description": "one time, in the person's local time"},
            "every": {"type": "string", "description": "an interval: 30m, 2h, 1d, 1w"},
            "cron": {"type": "string", "description": "a five-field cron expression"},
        },
        "required": ["instruction"],
        "additionalProperties": False,
    }

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        unknown = sorted(str(k) for k in args if k not in self.input_schema["properties"])
        if unknown:
            raise ToolError(f"unexpected argument(s): {', '.join(unknown)}")
        values = {k: args.get(k) for k in ("instruction", "when", "every", "cron")}
        if any(v is not None and not isinstance(v, str) for v in values.values()):
            raise ToolError("every argument is a string")
        zone = await self.schedules.zone_for(context.tenant, person_of(context))
        try:
            record = await self.schedules.create(
                tenant=context.tenant, owner=owner_of(context), target=target_of(context),
                created_by=person_owner(context.channel, context.person or context.chat),
                instruction=values["instruction"] or "", when=values["when"] or None,
                every=values["every"] or None, cron=values["cron"] or None, zone=zone)
        except (triggers.TriggerError, ScheduleLimitError) as exc:
            raise ToolError(str(exc)) from exc
        return ToolResult(f"Scheduled {self.schedules.words(record)}. "
                          f"{await self._now_line(context)} It can be cancelled with "
                          f"/reminders cancel {record.id}.")


class ScheduleList(_Base):
    name = "schedule_list"
    description = ("List the reminders and recurring tasks of this conversation, with their "
                   "ids, when each fires next, and the time now.")
    input_schema: Mapping[str, Any] = {"type": "object", "properties": {},
                                       "additionalProperties": False}

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        found = await self.schedules.owned(context.tenant, owner_of(context))
        lines = [self.schedules.words(r) for r in found] or ["(none)"]
        return ToolResult("\n".join([await self._now_line(context), *lines]))


class ScheduleCancel(_Base):
    name = "schedule_cancel"
    description = "Cancel one of this conversation's reminders or recurring tasks by its id."
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {"id": {"type": "string", "description": "the id schedule_list gives"}},
        "required": ["id"],
        "additionalProperties": False,
    }

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        ident = args.get("id")
        if not isinstance(ident, str) or not ident.strip():
            raise ToolError("give the id of the schedule to cancel")
        cancelled = await self.schedules.cancel(context.tenant, ident, owner_of(context))
        if cancelled is None:
            raise ToolError(f"this conversation has no active schedule {ident.strip()!r}")
        return ToolResult(f"Cancelled {cancelled.id}: {cancelled.instruction}")


def schedule_tools(schedules: Schedules) -> list[Tool]:
    return [ScheduleCreate(schedules), ScheduleList(schedules), ScheduleCancel(schedules)]
