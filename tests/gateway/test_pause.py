"""The router's pauses (gateway.delivery.pause): an erasure's hold waits for the running work
on its channel, holds new work there until it ends, and gives up with nothing held."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.delivery.pause import Pauses
from gateway.delivery.registry import ConversationRegistry
from gateway.edge.erasure import ErasureRefusedError, Hold
from gateway.edge.messages import ConversationKey
from gateway.edge.metrics import Metrics
from sessions.jsonl import JsonlSessionStore

ADA = ConversationKey("telegram", "1001")
TEAM = ConversationKey("telegram", "-100")
WEB = ConversationKey("web", "c1")
HOLD = Hold("default", "telegram")


def pauses(tmp_path: Path) -> Pauses:
    return Pauses(ConversationRegistry(JsonlSessionStore(tmp_path), Metrics()))


async def test_a_hold_waits_for_running_work_and_holds_new_work(tmp_path: Path) -> None:
    """The hold is granted once the turn running on its channel ends; a delivery on that
    channel waits until the hold ends; another channel goes on meanwhile."""
    p = pauses(tmp_path)
    events: list[str] = []
    turn_may_end = asyncio.Event()
    held = asyncio.Event()
    release = asyncio.Event()

    async def turn() -> None:
        async with p.active(ADA):
            events.append("turn started")
            await turn_may_end.wait()
            events.append("turn ended")

    async def erasure() -> None:
        async with p.holding(HOLD, timeout=60):
            events.append("held")
            held.set()
            await release.wait()
            events.append("released")

    async def delivery(key: ConversationKey, name: str) -> None:
        async with p.active(key):
            events.append(name)

    running = asyncio.create_task(turn())
    await asyncio.sleep(0)
    erasing = asyncio.create_task(erasure())
    await asyncio.sleep(0)
    await delivery(WEB, "web delivered")  # another channel: not held
    turn_may_end.set()
    await held.wait()
    waiting = asyncio.create_task(delivery(TEAM, "team delivered"))
    await delivery(WEB, "web delivered again")  # proof the held one had its chance
    release.set()
    await asyncio.gather(running, erasing, waiting)
    assert events == ["turn started", "web delivered", "turn ended", "held",
                      "web delivered again", "released", "team delivered"]


async def test_a_hold_that_cannot_be_had_holds_nothing(tmp_path: Path) -> None:
    """A turn that stays busy past the timeout: the hold is refused, saying why, and work on
    the channel goes on as if it had never been asked."""
    p = pauses(tmp_path)
    async with p.active(ADA):
        with pytest.raises(ErasureRefusedError, match="still busy"):
            async with p.holding(HOLD, timeout=0.05):
                raise AssertionError("granted while a turn ran")
        async with asyncio.timeout(10), p.active(TEAM):
            pass


async def test_the_conversation_serving_the_erasure_is_not_waited_for(tmp_path: Path) -> None:
    """/forget runs inside its own conversation's work: that one activity is exempt; a
    second delivery to that conversation still waits for the hold to end."""
    p = pauses(tmp_path)
    events: list[str] = []
    async with p.active(ADA):
        async with p.holding(Hold("default", "telegram", exempt=ADA), timeout=10):
            second = asyncio.create_task(_note(p, ADA, events))
            await asyncio.sleep(0)
            events.append("erased")
        await second
    assert events == ["erased", "second message"]


async def _note(p: Pauses, key: ConversationKey, events: list[str]) -> None:
    async with p.active(key):
        events.append("second message")
