"""Triggers: times people write, read in their zone; occurrences; the missed-occurrence
policy; each said back in words."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from gateway.schedule import triggers
from gateway.schedule.triggers import TriggerError
from sessions.schedules import ScheduleRecord, Target

BERLIN = ZoneInfo("Europe/Berlin")
NOW = datetime(2026, 3, 2, 18, 0, tzinfo=BERLIN).timestamp()  # a Monday


def at(day: int, hour: int, minute: int = 0, month: int = 3) -> float:
    return datetime(2026, month, day, hour, minute, tzinfo=BERLIN).timestamp()


@pytest.mark.parametrize(("text", "expected"), [
    ("tomorrow 9:00", at(3, 9)),
    ("tomorrow at 9am", at(3, 9)),
    ("today 7pm", at(2, 19)),
    ("9am", at(3, 9)),  # passed today: tomorrow
    ("23:30", at(2, 23, 30)),
    ("friday 18:30", at(6, 18, 30)),
    ("monday 9:00", at(9, 9)),  # today is Monday and 9:00 has passed: next week
    ("2026-03-11 09:00", at(11, 9)),
    ("2026-03-11T09:00", at(11, 9)),
    ("2026-03-11 09:00Z", datetime(2026, 3, 11, 9, 0, tzinfo=ZoneInfo("UTC")).timestamp()),
    ("in 2 hours", NOW + 7200),
    ("in 1h 30m", NOW + 5400),
    ("In 45 minutes", NOW + 2700),
])
def test_when_reads_what_people_write_in_their_zone(text: str, expected: float) -> None:
    """Each form means the instant a person in Berlin means by it on Monday 18:00."""
    assert triggers.when(text, BERLIN, NOW) == expected


@pytest.mark.parametrize("text", ["teatime", "25:00", "13pm", "2026-02-30 09:00", "in soon",
                                  "in 5 parsecs", "tomorrow 9:77"])
def test_when_refuses_what_it_cannot_read(text: str) -> None:
    """Unreadable times are a TriggerError with a message, never a guess."""
    with pytest.raises(TriggerError):
        triggers.when(text, BERLIN, NOW)


def test_wall_clock_times_across_a_dst_change() -> None:
    """09:00 the day after clocks go forward is 09:00 local (CEST), an hour less in UTC."""
    before = datetime(2026, 3, 28, 12, 0, tzinfo=BERLIN).timestamp()  # Saturday, CET
    moment = triggers.when("tomorrow 9:00", BERLIN, before)
    assert datetime.fromtimestamp(moment, BERLIN).hour == 9
    assert moment - before == 20 * 3600  # 21 wall-clock hours, 20 real ones


def test_span_and_cron_validation() -> None:
    """Intervals in several spellings; cron is five fields, checked."""
    assert [triggers.span(t) for t in ("30m", "2h", "1d", "90 minutes", "1 week")] == \
        [1800, 7200, 86400, 5400, 604800]
    assert triggers.cron(" 0  9 * * 1-5 ") == "0 9 * * 1-5"
    for bad in ("0 9 * *", "61 9 * * *", "0 9 * * 1-5 2026"):
        with pytest.raises(TriggerError):
            triggers.cron(bad)
    with pytest.raises(TriggerError):
        triggers.zone("Mars/Olympus")


def record(trigger: str, spec: str, *, next_at: float | None, start: float | None = None,
           ) -> ScheduleRecord:
    return ScheduleRecord(id="s1", tenant="default", owner="person:telegram:1",
                          target=Target("telegram", "1"), trigger=trigger,  # type: ignore[arg-type]
                          spec=spec, zone="Europe/Berlin", instruction="x",
                          created_by="person:telegram:1", created_at=NOW, next_at=next_at,
                          start=start)


def test_cron_occurrences_in_the_zone() -> None:
    """A weekday 09:00 cron fires at 09:00 Berlin time, skipping the weekend."""
    weekday = record("cron", "0 9 * * 1-5", next_at=None)
    friday = at(6, 9)
    assert triggers.next_after(weekday, friday) == at(9, 9)
    assert triggers.next_after(weekday, NOW) == at(3, 9)


def test_plan_fires_on_time_and_moves_on() -> None:
    """A due occurrence within the grace period is claimed; next_at moves to the next one."""
    every = record("every", "3600.0", next_at=NOW, start=NOW)
    claimed = triggers.plan(every, NOW + 30, grace=600)
    assert (claimed.firing, claimed.next_at, claimed.skipped) == (NOW, NOW + 3600, 0)


def test_plan_after_downtime_fires_the_newest_once_late_and_skips_the_older() -> None:
    """Down 3.5 hours with an hourly schedule: 09:00 ... 11:00 skipped, 12:00 fires late."""
    every = record("every", "3600.0", next_at=NOW, start=NOW)
    claimed = triggers.plan(every, NOW + 3.5 * 3600, grace=3600)
    assert claimed.firing == NOW + 3 * 3600
    assert claimed.next_at == NOW + 4 * 3600
    assert claimed.skipped == 3
    assert claimed.history[-1].reason == "late: 3 older missed"


def test_the_skip_after_downtime_names_the_first_missed_not_the_one_that_fires() -> None:
    """The recorded skip of the missed occurrences says when they began (09:00), never the
    time of the occurrence that fires (12:00): `gateway schedule show` must not call a
    delivered occurrence skipped."""
    every = record("every", "3600.0", next_at=NOW, start=NOW)
    claimed = triggers.plan(every, NOW + 3.5 * 3600, grace=3600)
    assert [(o.occurrence, o.outcome) for o in claimed.history] == [(NOW, "skipped")]
    assert claimed.firing == NOW + 3 * 3600


def test_plan_beyond_the_grace_period_skips_and_records_it() -> None:
    """A one-off reminder found two hours late (grace one hour) is skipped, recorded, done."""
    once = record("at", repr(NOW), next_at=NOW)
    claimed = triggers.plan(once, NOW + 7200, grace=3600)
    assert claimed.firing is None
    assert claimed.state == "done"
    assert (claimed.skipped, claimed.history[-1].outcome) == (1, "skipped")
    assert claimed.history[-1].reason == "late by 2 hours"


def test_described_in_words() -> None:
    """What the tools and /reminders say back: day, date, time, zone, how long from now."""
    once = record("at", repr(at(3, 9)), next_at=at(3, 9))
    assert triggers.describe(once, NOW) == \
        "once, on Tuesday 3 March 2026 at 09:00 (Europe/Berlin), in 15 hours"
    weekday = dataclasses.replace(record("cron", "0 9 * * 1-5", next_at=at(3, 9)))
    assert triggers.describe(weekday, NOW) == (
        "at 09:00 on Monday through Friday (Europe/Berlin, cron 0 9 * * 1-5); next on "
        "Tuesday 3 March 2026 at 09:00, in 15 hours")
