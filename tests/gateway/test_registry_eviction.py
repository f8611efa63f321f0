"""Eviction never closes a session whose last writes the disk failed: closed, its entries
could only be dropped (issue 12, item 3); open, its next append or the stop writes them."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gateway.delivery.registry import ConversationRegistry
from gateway.edge.messages import ChannelContext, ConversationKey
from gateway.edge.metrics import Metrics
from sessions.errors import SessionWriteError
from sessions.jsonl import JsonlSessionStore
from sessions.replay import replay_bytes
from tests.fakes.disk import FaultyDisk
from tests.sessions.helpers import add, user


def context(chat: str) -> ChannelContext:
    return ChannelContext("web", "private", chat, chat=chat, person=chat)


async def test_a_session_with_unwritten_entries_stays_open_past_max_open(tmp_path: Path) -> None:
    disk = FaultyDisk()
    registry = ConversationRegistry(JsonlSessionStore(tmp_path, ops=disk), Metrics(), max_open=1)
    ada, bob, cy = (ConversationKey("web", name) for name in ("ada", "bob", "cy"))
    first = await registry.get(ada, context("ada"))
    disk.fail(OSError(errno.ENOSPC, "No space left on device"))
    await add(first.recorder.writer, user("written when the disk has room"))
    # Wait for the write to meet the full disk: the append only queued it for the writer's
    # thread, which (on a busy machine) could otherwise first try after the disk recovered.
    with pytest.raises(SessionWriteError, match="kept for the next write"):
        await first.recorder.writer.flush()
    assert first.recorder.writer.pending_bytes > 0
    disk.recover()  # room again, but nothing has asked the writer to write since
    await registry.get(bob, context("bob"))
    assert registry.peek(ada) is first  # kept open: its entry is still only in memory
    assert len(registry) == 2

    # The next append is accepted, reporting the failure it follows; its write takes both.
    with pytest.raises(SessionWriteError, match=r"ENOSPC.*kept for the next write"):
        await add(first.recorder.writer, user("next"))
    await first.recorder.writer.flush()
    await registry.get(cy, context("cy"))  # now it can go
    assert registry.peek(ada) is None
    assert [m["content"] for m in replay_bytes(first.recorder.writer.path.read_bytes()).messages
            ] == ["written when the disk has room", "next"]
    await registry.aclose()


async def test_open_conversations_are_bounded_by_what_they_weigh(tmp_path: Path) -> None:
    """With room for about five short conversations, ten in turn leave the five most recent
    open, within the bound; one long conversation takes the room of several."""
    store = JsonlSessionStore(tmp_path, durability="none")
    short = await ConversationRegistry(store, Metrics()).get(  # what one weighs
        ConversationKey("web", "probe"), context("probe"))
    registry = ConversationRegistry(store, Metrics(), max_bytes=5 * short.approx_bytes + 100)
    names = [f"c{n}" for n in range(10)]
    for name in names:
        await registry.get(ConversationKey("web", name), context(name))
    assert [k.chat for k in registry.open_keys()] == names[5:]
    assert registry.open_bytes <= registry.max_bytes
    long = await registry.get(ConversationKey("web", "long"), context("long"))
    registry.hold(long.key)
    for _ in range(8):  # it grows while in use ...
        await long.receive(user("x" * 400))
    registry.release(long.key)  # ... and is weighed again as its use ends
    await registry.get(ConversationKey("web", "next"), context("next"))
    assert [k.chat for k in registry.open_keys()] == ["long", "next"]
    assert registry.open_bytes == long.approx_bytes + short.approx_bytes
    await registry.aclose()


async def test_open_conversations_that_grow_are_closed_to_stay_within_the_bound(
        tmp_path: Path) -> None:
    """Room for three short conversations, all three open: the first grows while in use past
    the bound, and the next message, to a conversation already open, closes it (the least
    recently used) first; no new conversation had to be opened for the bound to hold."""
    store = JsonlSessionStore(tmp_path, durability="none")
    short = await ConversationRegistry(store, Metrics()).get(
        ConversationKey("web", "probe"), context("probe"))
    registry = ConversationRegistry(store, Metrics(), max_bytes=3 * short.approx_bytes + 100)
    keys = {name: ConversationKey("web", name) for name in ("a", "b", "c")}
    convs = {name: await registry.get(key, context(name)) for name, key in keys.items()}
    registry.hold(keys["a"])
    for _ in range(8):
        await convs["a"].receive(user("x" * 400))
    registry.release(keys["a"])
    assert registry.open_bytes > registry.max_bytes  # weighed again, nothing closed yet
    assert await registry.get(keys["c"], context("c")) is convs["c"]
    assert [k.chat for k in registry._open] == ["b", "c"]
    assert registry.open_bytes <= registry.max_bytes
    await registry.aclose()


async def test_a_count_bound_still_applies_beside_the_memory_bound(tmp_path: Path) -> None:
    """``max_open`` (a JSONL session holds a descriptor) bounds the count even when memory
    would allow more."""
    registry = ConversationRegistry(JsonlSessionStore(tmp_path, durability="none"), Metrics(),
                                    max_open=3)
    for n in range(6):
        await registry.get(ConversationKey("web", f"c{n}"), context(f"c{n}"))
    assert [k.chat for k in registry.open_keys()] == ["c3", "c4", "c5"]
    await registry.aclose()
