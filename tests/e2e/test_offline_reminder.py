"""A reminder without a real model, as a newcomer meets it with `make run`: the web chat and
the offline provider (the defaults), a fake clock the test moves. "remind me in 2 minutes to
stretch" is a schedule_create call confirmed in words; two minutes later the reminder is
said in that conversation, once, and recorded as a scheduled turn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.compose import build_gateway
from app.server import Gateway
from gateway.schedule.clock import Clock
from sessions.schedule_file import FileScheduleStore
from tests.channels.test_web import settings
from tests.fakes.clock import FakeClock
from tests.waiting import until
from tests.web_ids import WEB_TENANT

START = 1_790_000_000.0  # Monday 21 September 2026, 14:13:20 UTC


@asynccontextmanager
async def chat(data_dir: Path, clock: Clock) -> AsyncIterator[tuple[Gateway, str]]:
    """The `make run` gateway (web chat, offline provider) and its base URL."""
    gateway = build_gateway(settings(data_dir), clock=clock)
    await gateway.start()
    try:
        yield gateway, f"http://127.0.0.1:{gateway.bound_port}"
    finally:
        await gateway.aclose()


async def history(http: aiohttp.ClientSession, base: str) -> list[dict[str, Any]]:
    async with http.get(f"{base}/api/history?conversation=c1") as response:
        assert response.status == 200
        messages: list[dict[str, Any]] = (await response.json())["messages"]
        return messages


@pytest.mark.parametrize("said", ["remind me in 2 minutes to stretch",
                                  "Remind me to stretch in 2 minutes."])
async def test_a_reminder_fires_with_the_offline_provider(tmp_path: Path, said: str) -> None:
    """Set offline, confirmed with its time in words; not said a second early; said once at
    its time in the conversation it was set in, as "Reminder: stretch"."""
    clock = FakeClock(START)
    async with chat(tmp_path, clock) as (_, base), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/chat",
                             json={"conversation": "c1", "text": said}) as response:
            assert response.status == 200
            reply = (await response.json())["reply"]
        [record] = await FileScheduleStore(tmp_path / "state").find(WEB_TENANT)
        rounds = clock.rounds
        clock.advance(119)  # a second early: a round, and nothing is said
        await clock.idle_after(rounds)
        early = await history(http, base)
        clock.advance(1)
        await until(lambda: reminded(http, base), what="the reminder in the history")
        rounds = clock.rounds
        clock.advance(3600)  # an hour on: it is not said again
        await clock.idle_after(rounds)
        after = await history(http, base)
    assert reply == (f"I'll remind you.\n\nDone: Scheduled {record.id}: once, on Monday 21 "
                     f"September 2026 at 14:15 (UTC), in 2 minutes: Remind them to stretch. It is "
                     f"now Monday 21 September 2026 at 14:13 (UTC). It can be cancelled with "
                     f"/reminders cancel {record.id}.")
    assert ("assistant", "Reminder: stretch") not in _texts(early)
    assert _texts(after)[len(_texts(early)):] == [
        ("user", f"scheduled: {record.id} Remind them to stretch"),
        ("assistant", "Reminder: stretch")]
    assert [m["text"] for m in after if m.get("scheduled")] == [
        f"scheduled: {record.id} Remind them to stretch"]  # marked: nobody typed it


def _texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["text"]) for m in messages if m["text"]]


async def reminded(http: aiohttp.ClientSession, base: str) -> bool:
    return ("assistant", "Reminder: stretch") in _texts(await history(http, base))
