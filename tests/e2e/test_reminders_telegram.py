"""Reminders people set through the model in Telegram: the real gateway against the fake Bot
API, a scripted model that calls ``schedule_create``, and a fake clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from gateway.edge.provider import ProviderRequest
from sessions.scan import message_text
from sessions.schedule_file import FileScheduleStore
from sessions.schedules import ScheduleRecord, Target
from tests.channels.test_telegram_harness import (
    ALICE,
    BOB,
    settled,
    telegram_settings,
    wait_until,
)
from tests.fakes.clock import FakeClock
from tests.fakes.scripted_provider import Reply, ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer

BERLIN = ZoneInfo("Europe/Berlin")
# Monday 2 March 2026, 18:00 in Berlin: "tomorrow at 9" is Tuesday 3 March, 09:00 (08:00 UTC).
START = datetime(2026, 3, 2, 18, 0, tzinfo=BERLIN).timestamp()
DUE = datetime(2026, 3, 3, 9, 0, tzinfo=BERLIN).timestamp()
REMINDER = "Time to call the bank, Ada!"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


def tool_call(name: str, **args: str) -> Reply:
    return {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": name, "input": args}]}


def answers(request: ProviderRequest) -> Reply:
    """The model: a scheduled turn gets the reminder, anything else ``ok``."""
    last = request.messages[-1]
    text = message_text(last["content"]) if last["role"] == "user" else ""
    return REMINDER if (text or "").startswith("scheduled: ") else "ok"


@asynccontextmanager
async def running(settings: Settings, provider: ScriptedProvider,
                  clock: FakeClock) -> AsyncIterator[Gateway]:
    gateway = build_gateway(settings, provider=provider, clock=clock)
    try:
        await gateway.start()
        yield gateway
    finally:
        await gateway.aclose()


async def test_reminder_set_through_the_tool_fires_once_at_its_time_in_that_dm_only(
        fake: FakeTelegramServer, tmp_path: Path) -> None:
    """"Remind me tomorrow at 9" in a DM: confirmed in words, fired once at 09:00 (fake clock),
    its text in that DM only, recorded as a scheduled turn."""
    clock = FakeClock(START)
    provider = ScriptedProvider(responder=answers)
    provider.script(tool_call("schedule_create", instruction="Remind Ada to call the bank",
                              when="tomorrow 9:00"),
                    "I will remind you tomorrow at 09:00.")
    settings = telegram_settings(fake, tmp_path, GATEWAY_TIMEZONE="Europe/Berlin")
    async with running(settings, provider, clock) as gateway:
        fake.user_message(ALICE, "remind me tomorrow at 9 to call the bank")
        await settled(gateway, 1)
        fake.user_message(BOB, "hello")
        await settled(gateway, 2)
        [record] = await gateway_schedules(tmp_path)
        assert record.next_at == DUE
        confirmation = tool_result_text(provider)
        assert "once, on Tuesday 3 March 2026 at 09:00 (Europe/Berlin), in 15 hours" \
            in confirmation, confirmation

        rounds = clock.rounds
        clock.advance(DUE - 1 - clock.now())  # one second early: a round, and nothing fires
        await clock.idle_after(rounds)
        assert fake.texts_to(ALICE) == ["I will remind you tomorrow at 09:00."]

        clock.advance(1)
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 2)
        await settled(gateway, 3)
        rounds = clock.rounds
        clock.advance(86_400 * 2)  # two days on: a round, and it does not fire again
        await clock.idle_after(rounds)
        [done] = await gateway_schedules(tmp_path, active_only=False)
        log = await dm_log(gateway, ALICE)

    assert fake.texts_to(ALICE) == ["I will remind you tomorrow at 09:00.", REMINDER]
    assert fake.texts_to(BOB) == ["ok"]
    assert (done.state, done.fired, done.skipped) == ("done", 1, 0)
    scheduled = [e for e in log if e.get("type") == "message"
                 and isinstance(e.get("meta"), dict) and "scheduled" in e["meta"]]
    [entry] = scheduled
    assert entry["message"] == {"role": "user",
                                "content": f"scheduled: {record.id} Remind Ada to call the bank"}
    assert entry["meta"]["scheduled"] == {"schedule": record.id,
                                          "occurrence": "2026-03-03T08:00:00.000Z",
                                          "created_by": f"person:telegram:{ALICE}"}


async def gateway_schedules(data_dir: Path, *,
                            active_only: bool = True) -> list[ScheduleRecord]:
    """The schedules in the gateway's file, as another process reads them."""
    return await FileScheduleStore(data_dir / "state").find("default", active_only=active_only)


def tool_result_text(provider: ScriptedProvider) -> str:
    """The text of the first tool result the model was sent."""
    for request in provider.requests:
        for message in request.messages:
            for block in message["content"] if isinstance(message["content"], list) else ():
                if block.get("type") == "tool_result":
                    return str(message_text(block["content"]) or block["content"])
    raise AssertionError("no tool result was sent")


async def dm_log(gateway: Gateway, chat: int) -> list[dict[str, Any]]:
    """The entries of the DM's one session."""
    [info] = [i for i in await gateway.store.list_sessions("default")
              if i.conversation == f"telegram:{chat}"]
    data = await gateway.store.read_log("default", info.session_id)
    return [orjson.loads(line) for line in data.splitlines()]


async def test_reminders_command_and_erasure_remove_only_the_persons_schedules(
        fake: FakeTelegramServer, tmp_path: Path) -> None:
    """/reminders lists and cancels in the person's own scope; /forget confirm erases their
    schedules and time zone, and nobody else's."""
    clock = FakeClock(START)
    provider = ScriptedProvider(responder=answers)
    provider.script(tool_call("schedule_create", instruction="water the plants", every="1d"),
                    "Daily it is.",
                    tool_call("schedule_create", instruction="stretch", when="in 2 hours"),
                    "Sure.",
                    tool_call("schedule_create", instruction="call mum", when="friday 18:00"),
                    "Will do.")
    settings = telegram_settings(fake, tmp_path, GATEWAY_TIMEZONE="Europe/Berlin")
    async with running(settings, provider, clock) as gateway:
        for n, text in enumerate(["remind me daily to water the plants",
                                  "and in 2 hours to stretch"], start=1):
            fake.user_message(ALICE, text)
            await settled(gateway, n)
        fake.user_message(BOB, "remind me on friday at 6pm to call mum")
        await settled(gateway, 3)
        mine = {r.instruction: r.id for r in await gateway_schedules(tmp_path)
                if r.owner == f"person:telegram:{ALICE}"}
        fake.user_message(ALICE, "/reminders")
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 3)
        listing = fake.texts_to(ALICE)[-1]
        assert "water the plants" in listing
        assert "stretch" in listing
        assert "call mum" not in listing
        [bobs] = [r.id for r in await gateway_schedules(tmp_path)
                  if r.owner == f"person:telegram:{BOB}"]
        fake.user_message(ALICE, f"/reminders cancel {bobs}")  # not hers: refused
        fake.user_message(ALICE, f"/reminders cancel {mine['stretch']}")
        fake.user_message(ALICE, "/reminders timezone America/New_York")
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 6)
        fake.user_message(ALICE, "/forget confirm")
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 7)
        left = await gateway_schedules(tmp_path, active_only=False)
        zone = await FileScheduleStore(tmp_path / "state").zone("default", f"telegram:{ALICE}")
    replies = fake.texts_to(ALICE)
    assert replies[3] == f"There is no active reminder {bobs!r} here."
    assert replies[4] == f"Cancelled {mine['stretch']}: stretch"
    assert replies[5].startswith("Done: your times are read in America/New_York")
    assert replies[6].startswith("Done: I erased")
    assert [(r.id, r.state) for r in left] == [(bobs, "active")]
    assert zone is None


async def test_telegram_is_written_to_only_where_the_person_talked_first(
        fake: FakeTelegramServer, tmp_path: Path) -> None:
    """Operators' schedules to Alice (who talked to the bot) and to Bob (who never did), due
    at once: Alice's DM gets hers; Bob is sent nothing, and his is recorded skipped, saying
    why."""
    clock = FakeClock(START)
    settings = telegram_settings(fake, tmp_path)
    async with running(settings, ScriptedProvider(responder=answers), clock) as gateway:
        fake.user_message(ALICE, "hello")
        await settled(gateway, 1)
        store = FileScheduleStore(tmp_path / "state")
        for person in (ALICE, BOB):
            await store.put(ScheduleRecord(
                id=f"s{person}", tenant="default", owner="tenant",
                target=Target("telegram", "", "private", None, str(person)), trigger="at",
                spec=repr(START + 60), zone="UTC", instruction="say hello",
                created_by="operator", created_at=START, next_at=START + 60))
        clock.advance(60)
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 2)
        await settled(gateway, 2)
        rounds = clock.rounds
        clock.advance(60)  # a round later: nothing more
        await clock.idle_after(rounds)
        done = {r.id: r for r in await gateway_schedules(tmp_path, active_only=False)}
    assert fake.texts_to(ALICE) == ["ok", REMINDER]
    assert fake.texts_to(BOB) == []
    assert (done[f"s{ALICE}"].fired, done[f"s{BOB}"].fired, done[f"s{BOB}"].skipped) == (1, 0, 1)
    assert done[f"s{BOB}"].history[-1].reason == f"telegram:{BOB} has never talked to the bot"


async def test_scheduled_turns_are_not_messages_the_rate_limit_refuses(
        fake: FakeTelegramServer, tmp_path: Path) -> None:
    """One message an hour per person: Alice's own reminder and an operator's message to her,
    due after she wrote, and an operator's two schedules to a group, due at once, are all
    answered: nobody sent them, so the message rate refuses none (it used to tell the group
    "You're sending messages faster than I can keep up with", and drop the reminder)."""
    def answers_groups_too(request: ProviderRequest) -> Reply:  # "[operator] scheduled: ..."
        text = message_text(request.messages[-1]["content"]) or ""
        return REMINDER if "scheduled: " in text else "ok"

    clock = FakeClock(START)
    provider = ScriptedProvider(responder=answers_groups_too)
    provider.script(tool_call("schedule_create", instruction="stretch", when="in 30 minutes"),
                    "Set.")
    settings = telegram_settings(fake, tmp_path, GATEWAY_RATE_LIMIT_MESSAGES=1,
                                 GATEWAY_RATE_LIMIT_SECONDS=3600,
                                 TELEGRAM_ALLOWED_CHATS="-100")
    async with running(settings, provider, clock) as gateway:
        fake.user_message(ALICE, "remind me in 30 minutes to stretch")
        await settled(gateway, 1)
        fake.user_message(-100, "@fake_test_bot hello", chat_type="group")
        await settled(gateway, 2)
        store = FileScheduleStore(tmp_path / "state")
        targets = {"to-alice": Target("telegram", "", "private", None, str(ALICE)),
                   "group-1": Target("telegram", "-100", "group"),
                   "group-2": Target("telegram", "-100", "group")}
        for ident, target in targets.items():
            await store.put(ScheduleRecord(
                id=ident, tenant="default", owner="tenant", target=target, trigger="at",
                spec=repr(START + 1800), zone="UTC", instruction="say hello",
                created_by="operator", created_at=START, next_at=START + 1800))
        clock.advance(1800)
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 3
                         and len(fake.texts_to(-100)) == 3)
        await settled(gateway, 6)
    assert fake.texts_to(ALICE) == ["Set.", REMINDER, REMINDER]
    assert fake.texts_to(-100) == ["ok", REMINDER, REMINDER]
