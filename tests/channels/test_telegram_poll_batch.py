"""How long polling handles a batch of updates: different chats side by side, each chat in
order, and the offset never past an update that was not handled. The real PTB bot against the
fake Bot API; ``handle`` is ours, so the test decides when each update finishes (no timing)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from telegram import Update

from channels.telegram.adapter import build_bot
from channels.telegram.polling import Poller
from channels.telegram.sink import BotApi
from gateway.edge.errors import UnavailableError
from gateway.edge.metrics import Metrics
from tests.channels.test_telegram_harness import ALICE, BOB, wait_until
from tests.fakes.telegram_api import FakeTelegramServer


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


async def poll(fake: FakeTelegramServer, handle: Callable[[Update], Awaitable[None]],
               until: Callable[[], bool]) -> None:
    """Run a poller over ``fake`` until ``until()`` holds, then stop it."""
    bot = build_bot(fake.token, fake.base_url, rate_limit=False)
    poller = Poller(BotApi(bot, Metrics(), fake.token, retry_429=False), handle,
                    poll_timeout=1, stall_seconds=5, backoff=0.01)
    async with bot:
        poller.start()
        try:
            await wait_until(until)
        finally:
            await poller.stop()


def text_of(update: Update) -> str:
    assert update.message is not None
    assert update.message.text is not None
    return update.message.text


async def test_chats_of_one_batch_are_handled_side_by_side_each_in_order(
        fake: FakeTelegramServer) -> None:
    """Alice's first update is still being handled when Bob's (later in the batch) is handled
    and ends; Alice's second starts only after her first ends. Handled one at a time, Alice's
    first would wait for Bob's forever and the poll would never move on."""
    fake.user_message(ALICE, "a1")
    fake.user_message(ALICE, "a2")
    last = fake.user_message(BOB, "b1")
    events: list[tuple[str, str]] = []
    bob_done = asyncio.Event()

    async def handle(update: Update) -> None:
        text = text_of(update)
        events.append(("start", text))
        if text == "a1":
            await bob_done.wait()
        events.append(("end", text))
        if text == "b1":
            bob_done.set()

    await poll(fake, handle, lambda: fake.confirmed_offset == last["update_id"] + 1)
    assert events.index(("end", "b1")) < events.index(("end", "a1"))
    assert events.index(("end", "a1")) < events.index(("start", "a2"))
    assert sorted(events) == sorted([(e, t) for t in ("a1", "a2", "b1") for e in ("start", "end")])


async def test_the_offset_stays_before_an_update_not_handled_while_other_chats_go_on(
        fake: FakeTelegramServer) -> None:
    """Alice's first update cannot be recorded once; Bob's, later in the batch, is. The offset
    is not confirmed past Alice's update until it is handled; her second is not tried before
    her first; everything comes again (Bob's twice: the router knows it as a repeat)."""
    a1 = fake.user_message(ALICE, "a1")
    fake.user_message(BOB, "b1")
    last = fake.user_message(ALICE, "a2")
    failing = {"a1"}
    handled: list[str] = []
    offsets_at_a1: list[int] = []

    async def handle(update: Update) -> None:
        text = text_of(update)
        if text in failing:
            failing.discard(text)
            raise UnavailableError("store", "full")
        if text == "a1":
            offsets_at_a1.append(fake.confirmed_offset)
        handled.append(text)

    await poll(fake, handle, lambda: fake.confirmed_offset == last["update_id"] + 1)
    assert offsets_at_a1
    assert offsets_at_a1[0] <= a1["update_id"]
    assert handled.count("a1") == 1
    assert handled.count("a2") == 1
    assert handled.index("a1") < handled.index("a2")
    assert handled.count("b1") == 2  # handled in the first batch, and again when it came back
