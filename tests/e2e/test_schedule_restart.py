"""Scheduled turns across a restart and in the log: missed occurrences follow the policy
(fire once late within the grace period, else skip and record it), a claimed occurrence is
delivered however late, and a scheduled turn's calls replay byte for byte."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, redirect_stdout
from pathlib import Path

import orjson
import pytest

from app.cli import main as cli_main
from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from gateway.edge.provider import Provider
from providers.anthropic import AnthropicProvider
from sessions.schedule_file import FileScheduleStore
from sessions.schedules import ScheduleRecord, Target
from tests.channels.test_telegram_harness import (
    ALICE,
    replay_of,
    settled,
    telegram_settings,
    wait_until,
)
from tests.e2e.test_reminders_telegram import START, answers
from tests.fakes.clock import FakeClock
from tests.fakes.providers import FakeProviderServer, Reply
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer

HOUR = 3600.0


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


@asynccontextmanager
async def running(settings: Settings, provider: Provider,
                  clock: FakeClock) -> AsyncIterator[Gateway]:
    gateway = build_gateway(settings, provider=provider, clock=clock)
    try:
        await gateway.start()
        yield gateway
    finally:
        await gateway.aclose()


def alices(ident: str, trigger: str, spec: str, next_at: float, *,
           start: float | None = None) -> ScheduleRecord:
    return ScheduleRecord(
        id=ident, tenant="default", owner=f"person:telegram:{ALICE}",
        target=Target("telegram", str(ALICE), "private", None, str(ALICE)),
        trigger=trigger, spec=spec, zone="Europe/Berlin",  # type: ignore[arg-type]
        instruction=f"say {ident}", created_by=f"person:telegram:{ALICE}",
        created_at=START, next_at=next_at, start=start)


async def test_restart_with_missed_occurrences_follows_the_policy(
        fake: FakeTelegramServer, tmp_path: Path) -> None:
    """Down for two hours (grace one hour): a reminder 2 h late is skipped and recorded, one
    30 min late fires once, a half-hourly one fires its newest occurrence once and counts
    three skipped, and one claimed before the stop is delivered although it is late."""
    settings = telegram_settings(fake, tmp_path, GATEWAY_SCHEDULE_GRACE=3600)
    provider = ScriptedProvider(responder=answers)
    async with running(settings, provider, FakeClock(START)) as gateway:
        fake.user_message(ALICE, "hello")  # the chat talks to the bot first
        await settled(gateway, 1)
    store = FileScheduleStore(tmp_path / "state")
    for record in [
        alices("slate", "at", repr(START + 60), START + 60),
        alices("sonce", "at", repr(START + 1.5 * HOUR), START + 1.5 * HOUR),
        alices("shalf", "every", "1800.0", START + 600, start=START + 600),
        dataclasses.replace(alices("sclaim", "at", repr(START + 100), START + 100),
                            next_at=None, firing=START + 100),  # claimed, then the stop
    ]:
        await store.put(record)
    clock = FakeClock(START + 2 * HOUR)
    async with running(settings, provider, clock) as gateway:
        await wait_until(lambda: len(fake.texts_to(ALICE)) == 4, timeout=20)
        await settled(gateway, 3)  # this run's turns
        rounds = clock.rounds
        clock.advance(60)  # a round later: nothing more fires
        await clock.idle_after(rounds)
    got = {r.id: r for r in await store.find("default", active_only=False)}
    said = sorted(t for t in fake.texts_to(ALICE)[1:])
    assert said == ["Time to call the bank, Ada!"] * 3  # sonce, shalf, sclaim
    assert (got["slate"].state, got["slate"].fired, got["slate"].skipped) == ("done", 0, 1)
    assert got["slate"].history[-1].reason == "late by 1 hour 59 minutes"
    assert (got["sonce"].state, got["sonce"].fired, got["sonce"].skipped) == ("done", 1, 0)
    assert (got["shalf"].state, got["shalf"].fired, got["shalf"].skipped) == ("active", 1, 3)
    assert got["shalf"].next_at == START + 600 + 4 * 1800
    assert (got["sclaim"].state, got["sclaim"].fired, got["sclaim"].skipped) == ("done", 1, 0)


def replay_cli(data_dir: Path, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli_main(["replay", "--data-dir", str(data_dir), *args])
    return code, out.getvalue()


async def test_a_scheduled_turn_replays_byte_for_byte_and_is_listed(
        fake: FakeTelegramServer, tmp_path: Path) -> None:
    """Set through the Anthropic SDK, fired at its time: every call's raw body is what
    `gateway replay --request N --raw` rebuilds; `--list` counts the scheduled turn."""
    clock = FakeClock(START)
    async with FakeProviderServer() as srv:
        srv.script("anthropic",
                   Reply.tool_use("schedule_create", {"instruction": "Remind Ada to call the "
                                                      "bank", "when": "in 2 hours"}),
                   Reply.text("Done: in two hours."),
                   Reply.text("Ada, call the bank now."))
        provider = AnthropicProvider(api_key="test-key", model="claude-test",
                                     base_url=srv.anthropic_base_url, max_retries=0)
        settings = telegram_settings(fake, tmp_path)
        async with running(settings, provider, clock) as gateway:
            fake.user_message(ALICE, "remind me in 2 hours to call the bank")
            await settled(gateway, 1)
            clock.advance(2 * HOUR)
            await wait_until(lambda: len(fake.texts_to(ALICE)) == 2, timeout=20)
            await settled(gateway, 2)
            replay = await replay_of(gateway, f"telegram:{ALICE}")
        raws = [r.raw for r in srv.requests_for("anthropic")]
    assert fake.texts_to(ALICE) == ["Done: in two hours.", "Ada, call the bank now."]
    assert len(raws) == len(replay.calls) == 3
    for n, raw in enumerate(raws, start=1):
        code, out = await asyncio.to_thread(replay_cli, tmp_path, replay.session_id,
                                            "--request", str(n), "--raw")
        assert code == 0
        assert out.encode() == raw
    third = orjson.loads(raws[2])["messages"][-1]
    assert third["role"] == "user"  # the trigger, as the model got it (a cache breakpoint on it)
    assert third["content"][0]["text"].startswith("scheduled: s")
    assert third["content"][0]["text"].endswith(" Remind Ada to call the bank")
    code, listing = await asyncio.to_thread(replay_cli, tmp_path, "--list")
    assert code == 0
    header, row = listing.splitlines()
    assert header.split()[-3:] == ["SCHEDULED", "FIRST", "MESSAGE"]
    column = header.index("SCHEDULED")
    assert row[column:column + len("SCHEDULED")].strip() == "1"
    code, listed = await asyncio.to_thread(replay_cli, tmp_path, "--list", "--json")
    assert [s["scheduled"] for s in orjson.loads(listed)] == [1]
