"""When a schedule fires: triggers read in a time zone, their occurrences, the missed-
occurrence policy, and each said back in words.

Three kinds (:class:`sessions.schedules.ScheduleRecord`'s ``trigger``):

* ``at``: one instant. People write it as ``2026-03-11 09:00``, ``tomorrow 9:00``,
  ``friday 18:30``, ``9am``, ``in 2 hours``; wall-clock times are read in the person's zone.
* ``every``: an interval (``30m``, ``2h``, ``1d``, ``90 minutes``), from a first instant.
* ``cron``: the standard five fields (minute hour day-of-month month day-of-week), evaluated
  in the zone by ``cronsim`` (which also says them in words), daylight-saving gaps and
  repeats included.

**Missed occurrences** (the gateway was down, or busy past them): at its claim, an
occurrence later than the grace period is skipped and the skip recorded; if several were
missed, the newest is the one that may still fire (once, late, within the grace period) and
the older ones are counted as skipped. A schedule never fires twice to catch up.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from datetime import UTC, date, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from sessions.schedules import Outcome, ScheduleRecord

MAX_CATCH_UP: Final = 10_000
"""Missed cron occurrences counted one by one; past this the count says "at least"."""
WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday",
                   "sunday")
_UNITS: Final = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60,
                 "h": 3600, "hr": 3600, "hour": 3600, "d": 86400, "day": 86400,
                 "w": 604800, "week": 604800}
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
_CLOCK = re.compile(r"^(\d{1,2})(?::(\d{2}))?\s*(am|pm)?$")
_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[ t](.+))?$")


class TriggerError(ValueError):
    """A trigger that cannot be read; the message says why in words fit for the person."""


def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name`` (``Europe/Berlin``, ``UTC``); :class:`TriggerError` otherwise."""
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise TriggerError(f"{name!r} is not a time zone name (e.g. Europe/Berlin, "
                           "America/New_York, UTC)") from exc


def span(text: str) -> float:
    """Seconds in ``30m``, ``2h``, ``1h 30m``, ``90 minutes``, ``1 week``."""
    cleaned = text.strip().lower()
    parts = _SPAN.findall(cleaned)
    if not parts or _SPAN.sub("", cleaned).replace(",", "").replace("and", "").strip():
        raise TriggerError(f"{text!r} is not a length of time (e.g. 30m, 2h, 1d, 90 minutes)")
    total = 0.0
    for number, unit in parts:
        factor = _UNITS.get(unit.rstrip("s") if unit not in _UNITS else unit)
        if factor is None:
            raise TriggerError(f"unknown unit {unit!r} (use minutes, hours, days or weeks)")
        total += float(number) * factor
    if total <= 0:
        raise TriggerError("a length of time must be more than zero")
    return total


def when(text: str, tz: ZoneInfo, now: float) -> float:
    """The instant ``text`` means, read in ``tz`` at ``now`` (see the module docstring)."""
    cleaned = " ".join(text.strip().lower().split())
    if cleaned.startswith("in "):
        return now + span(cleaned[3:])
    local = datetime.fromtimestamp(now, tz)
    dated = _DATE.match(cleaned)
    if dated is not None:
        try:
            day = date(int(dated.group(1)), int(dated.group(2)), int(dated.group(3)))
        except ValueError as exc:
            raise TriggerError(f"{text!r} is not a date") from exc
        return _at(day, dated.group(4) or "00:00", tz)
    word, _, rest = cleaned.partition(" ")
    if word in ("today", "tomorrow"):
        day = local.date() + timedelta(days=word == "tomorrow")
        return _at(day, rest or "09:00", tz)
    if word in WEEKDAYS:
        ahead = (WEEKDAYS.index(word) - local.weekday()) % 7
        moment = _at(local.date() + timedelta(days=ahead), rest or "09:00", tz)
        return moment if moment > now else _at(local.date() + timedelta(days=ahead + 7),
                                               rest or "09:00", tz)
    moment = _at(local.date(), cleaned, tz)  # a time alone: the next time it is that time
    return moment if moment > now else _at(local.date() + timedelta(days=1), cleaned, tz)


def _at(day: date, clock: str, tz: ZoneInfo) -> float:
    text = clock.strip().lower().removeprefix("at ").strip()
    match = _CLOCK.match(text.replace(".", ":"))
    if match is None:
        # ISO times with seconds or an offset: 09:00:30, 09:00+02:00, 09:00Z
        try:
            parsed = datetime.fromisoformat(f"{day.isoformat()}T{text.upper()}")
        except ValueError as exc:
            raise TriggerError(f"{clock!r} is not a time of day (e.g. 09:00, 9am, "
                               "18:30)") from exc
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=tz)).timestamp()
    hour, minute = int(match.group(1)), int(match.group(2) or 0)
    if match.group(3) is not None:
        if not 1 <= hour <= 12:
            raise TriggerError(f"{clock!r} is not a time of day")
        hour = hour % 12 + (12 if match.group(3) == "pm" else 0)
    if hour > 23 or minute > 59:
        raise TriggerError(f"{clock!r} is not a time of day")
    # fold=0: a wall-clock time that happens twice (clocks going back) is its first one; one
    # that never happens (clocks going forward) is read with the offset before the change.
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz).timestamp()


def cron(expression: str) -> str:
    """``expression`` checked as the standard five fields; :class:`TriggerError` if not."""
    fields = expression.split()
    if len(fields) != 5:
        raise TriggerError(f"{expression!r}: a cron expression has five fields "
                           "(minute hour day-of-month month day-of-week), e.g. 0 9 * * 1-5")
    text = " ".join(fields)
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise TriggerError(f"{expression!r} is not a cron expression ({exc})") from exc
    return text


def next_after(record: ScheduleRecord, after: float) -> float | None:
    """The schedule's first occurrence strictly after ``after`` (``None``: no more)."""
    if record.trigger == "at":
        moment = float(record.spec)
        return moment if moment > after else None
    if record.trigger == "every":
        start, interval = record.start or record.created_at, float(record.spec)
        if start > after:
            return start
        return start + (math.floor((after - start) / interval) + 1) * interval
    tz = zone(record.zone)
    found: datetime = next(CronSim(record.spec, datetime.fromtimestamp(after, tz)))
    return found.timestamp()


def first(record: ScheduleRecord, now: float) -> float | None:
    """The first occurrence of a new schedule (``at`` and ``every`` may start exactly now)."""
    if record.trigger == "cron":
        return next_after(record, now)
    return next_after(record, now - 1e-6)


def plan(record: ScheduleRecord, now: float, grace: float) -> ScheduleRecord:
    """Claim ``record``'s due occurrence at ``now``: ``firing`` set to it, or skipped when it
    is later than ``grace`` seconds; missed older ones counted as skipped; ``next_at`` moved
    past ``now`` (see the module docstring). Pure."""
    assert record.next_at is not None, "only a due record"
    occurrence, missed = record.next_at, 0
    following = next_after(record, occurrence)
    while following is not None and following <= now and missed < MAX_CATCH_UP:
        occurrence, missed = following, missed + 1
        following = next_after(record, occurrence)
    if following is not None and following <= now:  # more than MAX_CATCH_UP: jump ahead
        following = next_after(record, now)
    claimed = dataclasses.replace(record, next_at=following)
    if missed:  # recorded at the first one missed: the newest may still fire
        claimed = claimed.with_outcome(
            Outcome(record.next_at, "skipped", now,
                    f"late: {missed}{'+' if missed >= MAX_CATCH_UP else ''} older missed"),
            count=missed)
    if now - occurrence > grace:
        late = Outcome(occurrence, "skipped", now, f"late by {words_span(now - occurrence)}")
        return claimed.with_outcome(late).settled()
    return dataclasses.replace(claimed, firing=occurrence, held_until=None, held_reason=None)


def min_gap(record: ScheduleRecord, now: float, samples: int = 6) -> float:
    """The shortest time between the schedule's next few occurrences (inf for ``at``)."""
    if record.trigger == "at":
        return math.inf
    if record.trigger == "every":
        return float(record.spec)
    times: list[float] = []
    moment: float | None = now
    while moment is not None and len(times) < samples:
        moment = next_after(record, moment)
        if moment is not None:
            times.append(moment)
    return min((b - a for a, b in itertools.pairwise(times)), default=math.inf)


# -- in words -------------------------------------------------------------------------------

def local_words(moment: float, tz: ZoneInfo) -> str:
    """``Tuesday 11 March 2026 at 09:00``, in ``tz``."""
    local = datetime.fromtimestamp(moment, tz)
    return f"{local:%A} {local.day} {local:%B %Y} at {local:%H:%M}"


def words_span(seconds: float) -> str:
    """``14 hours``, ``2 days 3 hours``, ``25 minutes``, ``40 seconds``."""
    seconds = max(0, round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "day"), (hours, "hour"), (minutes, "minute")]
    said = [f"{n} {unit}{'s' if n != 1 else ''}" for n, unit in parts if n][:2]
    return " ".join(said) or f"{secs} second{'s' if secs != 1 else ''}"


def describe(record: ScheduleRecord, now: float) -> str:
    """The schedule's trigger in words, with its zone and its next occurrence."""
    tz = zone(record.zone)
    upcoming = record.firing or record.next_at
    if record.trigger == "at":
        moment = float(record.spec)
        return (f"once, on {local_words(moment, tz)} ({record.zone}), "
                + (f"in {words_span(moment - now)}" if moment > now else "now"))
    if record.trigger == "every":
        said = f"every {words_span(float(record.spec))} ({record.zone})"
    else:
        explained = CronSim(record.spec, datetime.fromtimestamp(now, tz)).explain()
        said = f"{explained[:1].lower()}{explained[1:]} ({record.zone}, cron {record.spec})"
    if upcoming is None:
        return f"{said}; no occurrence left"
    return f"{said}; next on {local_words(upcoming, tz)}, in {words_span(upcoming - now)}"
