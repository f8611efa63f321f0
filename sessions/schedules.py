"""Schedules as stored: the records both schedule stores keep, and their JSON form.

A schedule says *when* (a trigger), *where* (a target conversation), *what* (the instruction
the agent is given when it fires), *whose* it is (its owner scope) and *who* set it. The
rules (parsing triggers, computing occurrences, limits, who may see what) are the core's
(:mod:`gateway.schedule`); this module is only the vocabulary the stores share, so that a
store depends on nothing above it, like the session logs (``sessions/`` imports nothing of
ours).

Owners are written ``person:CHANNEL:ID`` (a reminder set in a one-to-one chat),
``chat:CHANNEL:ID`` (set in a group: the group's) or ``tenant`` (set by the operator).
Times are Unix seconds (UTC); the zone a trigger is read in is an IANA name.

The firing cycle a store runs (see :class:`gateway.schedule.store.ScheduleStore`): a due
occurrence is first *claimed*, ``firing`` set to it and ``next_at`` moved on to the one
after, in one write; then *delivered*, and ``firing`` cleared with the outcome in
``history``. An occurrence claimed is delivered however long that takes (a restart, a rate
limit); one found late by more than the grace period at its claim is skipped instead and the
skip recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

TriggerKind = Literal["at", "every", "cron"]
State = Literal["active", "done", "cancelled"]
TRIGGERS: Final = ("at", "every", "cron")
STATES: Final = ("active", "done", "cancelled")
HISTORY: Final = 10
"""Outcomes kept per schedule (the newest), for ``gateway schedule show``."""


@dataclass(frozen=True, slots=True)
class Target:
    """The conversation a schedule speaks in: ``channel`` and ``chat`` (and ``thread``) name
    it as its conversation key does; ``chat_type`` is ``private`` for a one-to-one chat;
    ``person`` is whom a one-to-one chat is with. ``chat`` may be empty for an operator's
    schedule addressed to a person: the channel opens the direct chat when it fires (Slack's
    ``conversations.open``)."""

    channel: str
    chat: str
    chat_type: str = "private"
    thread: str | None = None
    person: str | None = None

    def label(self) -> str:
        """As a conversation key's label (``CHANNEL:CHAT[:THREAD]``), or ``CHANNEL:@PERSON``
        when the chat is opened at firing."""
        if not self.chat:
            return f"{self.channel}:@{self.person or '?'}"
        base = f"{self.channel}:{self.chat}"
        return f"{base}:{self.thread}" if self.thread else base


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one occurrence: ``fired`` (owed to its conversation), ``skipped``
    (``reason``: ``late``, ``unreachable``), at ``at`` (when it was decided)."""

    occurrence: float
    outcome: str
    at: float
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """One schedule (see the module docstring). ``spec`` is the trigger's text: the instant
    (Unix seconds) for ``at``, the interval in seconds for ``every``, the expression for
    ``cron``; ``start`` anchors an ``every``. ``next_at`` is the next occurrence not claimed
    yet (``None``: none left), ``firing`` the one claimed and not delivered yet."""

    id: str
    tenant: str
    owner: str
    target: Target
    trigger: TriggerKind
    spec: str
    zone: str
    instruction: str
    created_by: str
    created_at: float
    state: State = "active"
    next_at: float | None = None
    firing: float | None = None
    start: float | None = None
    fired: int = 0
    skipped: int = 0
    held_until: float | None = None
    """Not delivered before this (a rate limit or an outage held the claimed occurrence)."""
    held: int = 0
    """How many times a delivery of this schedule was put off (a rate limit, an outage)."""
    held_reason: str | None = None
    """Why the claimed occurrence waits until ``held_until``."""
    history: tuple[Outcome, ...] = field(default=())

    @property
    def active(self) -> bool:
        return self.state == "active"

    def with_outcome(self, outcome: Outcome, count: int = 1) -> ScheduleRecord:
        """This record with ``outcome`` counted (``count`` times: missed occurrences told
        in one outcome) and kept (the newest :data:`HISTORY`)."""
        fired = self.fired + count * (outcome.outcome == "fired")
        skipped = self.skipped + count * (outcome.outcome == "skipped")
        return dataclasses.replace(self, fired=fired, skipped=skipped,
                                   history=(*self.history, outcome)[-HISTORY:])

    def settled(self) -> ScheduleRecord:
        """Done once nothing is claimed and no occurrence is left."""
        if self.state == "active" and self.next_at is None and self.firing is None:
            return dataclasses.replace(self, state="done")
        return self


def to_json(record: ScheduleRecord) -> dict[str, Any]:
    """The record as plain JSON data (the JSONL store's line, the tests' comparisons).
    Written out field by field: ``dataclasses.asdict`` costs ten times as much, and a store
    of 10,000 schedules encodes every changed one at each firing."""
    t = record.target
    return {
        "id": record.id, "tenant": record.tenant, "owner": record.owner,
        "target": {"channel": t.channel, "chat": t.chat, "chat_type": t.chat_type,
                   "thread": t.thread, "person": t.person},
        "trigger": record.trigger, "spec": record.spec, "zone": record.zone,
        "instruction": record.instruction, "created_by": record.created_by,
        "created_at": record.created_at, "state": record.state, "next_at": record.next_at,
        "firing": record.firing, "start": record.start, "fired": record.fired,
        "skipped": record.skipped, "held_until": record.held_until, "held": record.held,
        "held_reason": record.held_reason,
        "history": [{"occurrence": o.occurrence, "outcome": o.outcome, "at": o.at,
                     "reason": o.reason} for o in record.history],
    }


def from_json(body: Mapping[str, Any]) -> ScheduleRecord:
    """The record ``to_json`` wrote; ``ValueError`` for anything else."""
    try:
        target = body["target"]
        trigger, state = body["trigger"], body.get("state", "active")
        if trigger not in TRIGGERS or state not in STATES:
            raise ValueError(f"unknown trigger {trigger!r} or state {state!r}")
        return ScheduleRecord(
            id=str(body["id"]), tenant=str(body["tenant"]), owner=str(body["owner"]),
            target=Target(str(target["channel"]), str(target["chat"]),
                          str(target.get("chat_type") or "private"),
                          _text(target.get("thread")), _text(target.get("person"))),
            trigger=trigger, spec=str(body["spec"]), zone=str(body["zone"]),
            instruction=str(body["instruction"]), created_by=str(body["created_by"]),
            created_at=float(body["created_at"]), state=state,
            next_at=_time(body.get("next_at")), firing=_time(body.get("firing")),
            start=_time(body.get("start")), fired=int(body.get("fired") or 0),
            skipped=int(body.get("skipped") or 0), held_until=_time(body.get("held_until")),
            held=int(body.get("held") or 0), held_reason=_text(body.get("held_reason")),
            history=tuple(Outcome(float(o["occurrence"]), str(o["outcome"]), float(o["at"]),
                                  _text(o.get("reason")))
                          for o in body.get("history") or ()),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a schedule record ({type(exc).__name__}: {exc})") from exc


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _time(value: Any) -> float | None:
    return None if value is None else float(value)


class ScheduleLimitError(Exception):
    """A new schedule would pass a limit (per owner or per tenant); the message says which,
    in words fit to show the person."""


def person_owner(channel: str, person: str) -> str:
    """The owner of a reminder a person set in a one-to-one chat."""
    return f"person:{channel}:{person}"


def belongs_to(record: ScheduleRecord, channel: str, person: str) -> bool:
    """Whether ``record`` is the person's, for erasure: they own it, they set it (a reminder
    set in a group is the group's to count and cancel, but it would fire in their name and
    with their words after the erasure), or it speaks in their one-to-one chat (an
    operator's schedule addressed to them)."""
    if person_owner(channel, person) in (record.owner, record.created_by):
        return True
    target = record.target
    return target.channel == channel and target.chat_type == "private" and (
        target.person == person or (target.person is None and target.chat == person))
