"""``/reminders``: the conversation's schedules, to list and cancel, and the person's zone.

``/reminders`` lists this conversation's reminders and recurring tasks (a person's own in a
one-to-one chat, the group's in a group), each with its id and next time in words;
``/reminders cancel ID`` cancels one of them; ``/reminders timezone Europe/Berlin`` sets the
zone the person's times are read in (``/reminders timezone`` alone says which it is). In
Slack: ``/gateway reminders ...``.
"""

from __future__ import annotations

from gateway.edge.commands import CommandCall
from gateway.schedule import triggers
from gateway.schedule.service import Schedules
from gateway.schedule.tools import owner_of, person_of

USAGE = ("/reminders lists this chat's reminders; /reminders cancel ID cancels one; "
         "/reminders timezone ZONE sets your time zone (e.g. Europe/Berlin).")


class RemindersCommand:
    """The handler of ``/reminders`` (see the module docstring)."""

    def __init__(self, schedules: Schedules) -> None:
        self.schedules = schedules

    async def run(self, call: CommandCall) -> str:
        context = call.context
        word, _, rest = call.args.partition(" ")
        word = word.lower()
        if word in ("", "list"):
            found = await self.schedules.owned(context.tenant, owner_of(context))
            if not found:
                return "No reminders here. Ask me to remind you of something, any time."
            return "\n".join(["Reminders here:",
                              *(f"- {self.schedules.words(r)}" for r in found),
                              "Cancel one with /reminders cancel ID."])
        if word == "cancel":
            if not rest.strip():
                return "Which one? /reminders cancel ID (the ids are in /reminders)."
            cancelled = await self.schedules.cancel(context.tenant, rest, owner_of(context))
            if cancelled is None:
                return f"There is no active reminder {rest.strip()!r} here."
            return f"Cancelled {cancelled.id}: {cancelled.instruction}"
        if word in ("timezone", "tz", "zone"):
            return await self._zone(call, rest.strip())
        return USAGE

    async def _zone(self, call: CommandCall, name: str) -> str:
        context = call.context
        person = person_of(context)
        if person is None:
            return "I cannot tell who you are here, so I cannot keep a time zone for you."
        if not name:
            zone = await self.schedules.zone_for(context.tenant, person)
            return f"Your times are read in {zone}. Change it with /reminders timezone ZONE."
        try:
            zone = triggers.zone(name).key
        except triggers.TriggerError as exc:
            return str(exc)
        await self.schedules.store.set_zone(context.tenant, person, zone)
        now = self.schedules.clock.now()
        return (f"Done: your times are read in {zone} from now on (it is "
                f"{triggers.local_words(now, triggers.zone(zone))} there).")
