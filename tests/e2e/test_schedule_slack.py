"""Proactive turns on Slack: the real gateway, slack_sdk against the fake Slack Web API, a
scripted model and a fake clock the test moves. An operator's schedule to a person opens
their DM with ``conversations.open`` and speaks there; the per-tenant heartbeat speaks every
N minutes in its conversation, once per occurrence, across a restart, and only when set."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.cli import main as cli_main
from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from channels.slack.sink import PLACEHOLDER
from gateway.edge.provider import ProviderRequest
from gateway.schedule.heartbeat import CREATED_BY, heartbeat_id
from gateway.usage.limits import iso_time
from sessions.scan import message_text
from sessions.schedule_file import FileScheduleStore
from sessions.schedules import ScheduleRecord
from tests.channels.test_slack_gateway import events_url, metric, slack_settings, turns
from tests.fakes.clock import FakeClock
from tests.fakes.scripted_provider import Reply, ScriptedProvider
from tests.fakes.slack_api import FakeSlackServer
from tests.waiting import until

TEAM = "T0FAKETEAM"
GENERAL = "C0FAKEGEN"
START = 1_790_000_000.0
MINUTE = 60.0
BEAT = [{"tenant": TEAM, "conversation": f"slack:{GENERAL}", "minutes": 30,
         "instruction": "Post the half-hourly check-in."}]


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer() as server:
        server.add_channel(GENERAL, name="general")
        yield server


@pytest.fixture(autouse=True)
def _file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads the environment as `gateway run` does: the data folder's file here."""
    monkeypatch.delenv("GATEWAY_STORE_URL", raising=False)


def answers(request: ProviderRequest) -> Reply:
    """The model: a scheduled turn says its schedule and instruction, anything else ``ok``."""
    last = request.messages[-1]
    text = (message_text(last["content"]) or "") if last["role"] == "user" else ""
    if "scheduled: " not in text:
        return "ok"
    ident, _, instruction = text.split("scheduled: ", 1)[1].partition(" ")
    return f"({ident}) {instruction}"


@asynccontextmanager
async def running(settings: Settings, clock: FakeClock) -> AsyncIterator[Gateway]:
    gateway = build_gateway(settings, provider=ScriptedProvider(responder=answers),
                            clock=clock)
    try:
        await gateway.start()
        yield gateway
    finally:
        await gateway.aclose()


def schedule_cli(data_dir: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = cli_main(["schedule", "--data-dir", str(data_dir), *args])
    return code, out.getvalue()


async def schedules(data_dir: Path) -> list[ScheduleRecord]:
    """Every schedule of the team, as another process reads the gateway's file."""
    return await FileScheduleStore(data_dir / "state").find(TEAM, active_only=False)


async def scheduled_entries(gateway: Gateway, conversation: str) -> list[dict[str, Any]]:
    """The scheduled trigger messages in the conversation's sessions, oldest first."""
    found = []
    for info in await gateway.store.list_sessions(TEAM):
        if info.conversation != conversation:
            continue
        for line in (await gateway.store.read_log(TEAM, info.session_id)).splitlines():
            entry = orjson.loads(line)
            if entry.get("type") == "message" and "scheduled" in (entry.get("meta") or {}):
                found.append(entry)
    return sorted(found, key=lambda e: str(e["meta"]["scheduled"]["occurrence"]))


def posted(fake: FakeSlackServer) -> list[tuple[str | None, str | None]]:
    """(channel, text as it reads now) of every message the bot posted, anywhere: an answer
    outside a thread opens as a placeholder and is then updated into its text."""
    return [(call.channel, fake.messages.get((str(call.channel), str(call.ts)), {}).get("text"))
            for call in fake.posts()]


def answered(fake: FakeSlackServer, count: int) -> bool:
    """``count`` messages posted, each updated past its placeholder."""
    said = posted(fake)
    return len(said) == count and all(text != PLACEHOLDER for _, text in said)


async def round_after(clock: FakeClock, seconds: float) -> None:
    """Move the clock on and wait until the scheduler has been round once more."""
    rounds = clock.rounds
    clock.advance(seconds)
    await clock.idle_after(rounds)


async def test_a_schedule_to_a_slack_person_opens_their_dm_and_speaks_there_once(
        fake: FakeSlackServer, tmp_path: Path) -> None:
    """`gateway schedule add --to slack:U1`: at its time (not before) the gateway opens U1's
    DM with conversations.open, the turn is answered in that DM and nowhere else, once, and
    recorded as that DM's conversation, which U1's answer then continues."""
    fake.add_user("U1")
    clock = FakeClock(time.time())  # the CLI reads "in 1 hour" on the system clock
    async with running(slack_settings(fake, tmp_path), clock) as gateway:
        code, out = await asyncio.to_thread(
            schedule_cli, tmp_path, "add", "--tenant", TEAM, "--to", "slack:U1",
            "--when", "in 1 hour", "--say", "Ask about the invoice.")
        assert code == 0, out
        [record] = await schedules(tmp_path)
        assert record.next_at is not None
        await round_after(clock, record.next_at - 1 - clock.now())
        assert (fake.opened(), posted(fake)) == ([], [])  # one second early: nothing
        clock.advance(1)
        await until(lambda: turns(gateway) == 1 and answered(fake, 1))
        [(user, dm)] = fake.opened()
        await round_after(clock, 86_400)  # a day on: a round, and nothing more is said
        said = posted(fake)
        opened = fake.opened()
        await fake.deliver_event(events_url(gateway),
                                 fake.dm_event("U1", "done, thanks", channel=dm))
        await until(lambda: turns(gateway) == 2)
        [done] = await schedules(tmp_path)
        [entry] = await scheduled_entries(gateway, f"slack:{dm}")
        [info] = await gateway.store.list_sessions(TEAM)
        log = await gateway.store.read_log(TEAM, info.session_id)
    assert (user, dm) == ("U1", fake.im_channel_for("U1"))
    assert opened == [("U1", dm)]
    assert said == [(dm, f"({record.id}) Ask about the invoice.")]
    assert (done.state, done.fired, done.skipped) == ("done", 1, 0)
    assert entry["message"]["content"] == f"scheduled: {record.id} Ask about the invoice."
    assert entry["meta"]["scheduled"] == {"schedule": record.id,
                                          "occurrence": iso_time(record.next_at),
                                          "created_by": "operator"}
    assert info.conversation == f"slack:{dm}"
    assert b"done, thanks" in log


async def test_a_person_slack_will_not_open_a_dm_with_is_skipped_and_recorded(
        fake: FakeSlackServer, tmp_path: Path) -> None:
    """conversations.open answers user_not_found (nobody by that id): nothing is posted, the
    occurrence is recorded skipped with the reason, and the skip is counted."""
    clock = FakeClock(time.time())
    async with running(slack_settings(fake, tmp_path), clock) as gateway:
        code, out = await asyncio.to_thread(
            schedule_cli, tmp_path, "add", "--tenant", TEAM, "--to", "slack:U0NOBODY",
            "--when", "in 1 hour", "--say", "Say hello.")
        assert code == 0, out
        [record] = await schedules(tmp_path)
        assert record.next_at is not None
        await round_after(clock, record.next_at - clock.now())
        skipped = metric(gateway, "gateway_schedule_occurrences_total", outcome="skipped")
        refused = metric(gateway, "gateway_channel_errors_total", kind="user_not_found")
    [done] = await schedules(tmp_path)
    assert [(c.params["users"], c.error) for c in fake.calls_of("conversations.open")] == [
        ("U0NOBODY", "user_not_found")]
    assert posted(fake) == []
    assert (done.state, done.fired, done.skipped) == ("done", 0, 1)
    assert done.history[-1].reason == "slack did not open a chat with U0NOBODY"
    assert (skipped, refused) == (1, 1)


async def test_the_heartbeat_speaks_every_n_minutes_once_per_occurrence_across_a_restart(
        fake: FakeSlackServer, tmp_path: Path) -> None:
    """GATEWAY_HEARTBEATS (every 30 minutes in #general): fired at +30 min and +60 min, not in
    between, once each although the gateway restarted in between (its next time kept), each
    recorded as a scheduled turn of that conversation; dropped from the settings, it is
    cancelled at the next start and says nothing more."""
    beat = slack_settings(fake, tmp_path, GATEWAY_HEARTBEATS=orjson.dumps(BEAT).decode())
    ident = heartbeat_id(TEAM, "slack", GENERAL)
    clock = FakeClock(START)
    async with running(beat, clock) as gateway:
        await clock.idle_after(0)
        [put] = await schedules(tmp_path)
        await round_after(clock, 30 * MINUTE - 1)
        early = posted(fake)
        clock.advance(1)
        await until(lambda: turns(gateway) == 1 and answered(fake, 1))
    clock = FakeClock(START + 31 * MINUTE)  # restarted a minute after the first occurrence
    async with running(beat, clock) as gateway:
        await clock.idle_after(0)
        [kept] = await schedules(tmp_path)
        after_restart = posted(fake)
        await round_after(clock, 29 * MINUTE - 1)
        clock.advance(1)
        await until(lambda: turns(gateway) == 1 and answered(fake, 2))
        await round_after(clock, MINUTE)
        entries = await scheduled_entries(gateway, f"slack:{GENERAL}")
    clock = FakeClock(START + 62 * MINUTE)
    async with running(slack_settings(fake, tmp_path), clock) as gateway:  # no heartbeat
        await clock.idle_after(0)
        await round_after(clock, 60 * MINUTE)
    [dropped] = await schedules(tmp_path)
    said = f"({ident}) Post the half-hourly check-in."
    assert (put.id, put.created_by, put.next_at) == (ident, CREATED_BY, START + 30 * MINUTE)
    assert early == []
    assert after_restart == [(GENERAL, said)]
    assert (kept.next_at, kept.fired) == (START + 60 * MINUTE, 1)
    assert posted(fake) == [(GENERAL, said), (GENERAL, said)]
    assert [e["meta"]["scheduled"] for e in entries] == [
        {"schedule": ident, "occurrence": iso_time(START + n * MINUTE),
         "created_by": CREATED_BY} for n in (30, 60)]
    assert (dropped.state, dropped.fired, dropped.skipped) == ("cancelled", 2, 0)


async def test_no_heartbeat_unless_configured(fake: FakeSlackServer, tmp_path: Path) -> None:
    """Off by default: the scheduler's first round puts no schedule, and a day later nothing
    has been said."""
    clock = FakeClock(START)
    async with running(slack_settings(fake, tmp_path), clock):
        await clock.idle_after(0)
        found = await schedules(tmp_path)
        await round_after(clock, 86_400)
    assert found == []
    assert posted(fake) == []
