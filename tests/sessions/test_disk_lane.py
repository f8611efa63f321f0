"""The JSONL writer on a hung disk: the event loop never waits on it, the stall is reported,
and everything accepted meanwhile lands, in order, once the disk answers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sessions.errors import SessionWriteError
from sessions.jsonl import JsonlSessionStore, JsonlSessionWriter
from sessions.jsonl_writer import BATCH_BYTES, STALLED
from sessions.replay import replay_bytes
from tests.fakes.disk import FaultyDisk
from tests.sessions.helpers import add, log_entries, user
from tests.waiting import WAIT, until

STALL_AFTER = 0.2


async def ticks_during(seconds: float) -> int:
    """How many 10 ms sleeps the event loop completes in ``seconds`` (0 if it is blocked): time
    passing the lane's stall bound, watched from the loop."""
    count = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(0.01)
        count += 1
    return count


async def flushed_once_answered(writer: JsonlSessionWriter) -> None:
    """Flush, retrying while the lane still reports the stall it is just leaving (bounded)."""
    async def flushed() -> bool:
        try:
            await writer.flush()
        except SessionWriteError as exc:
            if exc.kind != STALLED:
                raise
            return False
        return True

    await until(flushed, what="a flush once the disk answers")


async def test_hung_disk_never_blocks_the_loop_and_writes_in_order_after(
    tmp_path: Path,
) -> None:
    """While the disk hangs, appends return at once (the loop keeps running), are reported as
    STALLED once past stall_after, flush and read_log do not wait on the stuck write; once the
    disk answers every accepted entry is in the file, seq in order."""
    disk = FaultyDisk()
    store = JsonlSessionStore(tmp_path, durability="none", ops=disk, stall_after=STALL_AFTER)
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("before"))
    await writer.flush()
    disk.fail("hang")
    await add(writer, user("stuck 1"))  # accepted; the lane's write hangs
    assert await asyncio.to_thread(disk.hung.wait, 5)
    ticked = await ticks_during(STALL_AFTER * 2)
    with pytest.raises(SessionWriteError) as stalled:
        await add(writer, user("stuck 2"))
    with pytest.raises(SessionWriteError) as flushed:
        await writer.flush()
    on_disk = await store.read_log("default", "s1")  # does not wait for the stuck write
    disk.recover()
    await flushed_once_answered(writer)
    await add(writer, user("after"))
    await writer.aclose()

    # The event loop ran all along (a blocked one would tick 0 times; a busy machine only
    # ticks fewer), and nothing waited on the write that hangs until recover(): that wait
    # would never have ended, so the test got here without one (no clock is read).
    assert ticked >= 1
    assert (stalled.value.kind, stalled.value.accepted) == (STALLED, True)
    assert (flushed.value.kind, flushed.value.accepted) == (STALLED, True)
    assert b"stuck" not in on_disk
    assert [e["seq"] for e in log_entries(writer.path)] == [0, 1, 2, 3, 4]
    replay = replay_bytes(writer.path.read_bytes())
    assert replay.problems == ()
    assert list(replay.messages) == [user("before"), user("stuck 1"), user("stuck 2"),
                                     user("after")]


async def test_close_waits_for_a_disk_that_comes_back(tmp_path: Path) -> None:
    """aclose() on a hung disk finishes once the disk answers, with everything written."""
    disk = FaultyDisk()
    store = JsonlSessionStore(tmp_path, durability="turn", ops=disk, stall_after=STALL_AFTER)
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    disk.fail("hang")
    await add(writer, user("late"))
    closing = asyncio.create_task(writer.aclose())
    assert await asyncio.to_thread(disk.hung.wait, WAIT)
    disk.recover()
    await asyncio.wait_for(closing, WAIT)
    # The close came after the hung operation returned: it waited for the disk.
    assert disk.events[-3:] == ["hung", "released", "close"]
    assert list(replay_bytes(writer.path.read_bytes()).messages) == [user("late")]
    reopened = await store.open("default", "s1")  # the lock was released with the file
    await reopened.aclose()


async def test_appends_that_never_yield_are_still_written(tmp_path: Path) -> None:
    """A caller appending 20 MB in a loop that never yields to the event loop (so no timer
    runs) still gets everything written: full batches go to the lane at once, and the
    writer never reaches its backlog cap.

    Between appends the test blocks the loop's thread (never the loop) until the lane has
    caught up, so how fast the lane's thread is scheduled on a busy machine does not matter:
    what is proven is that a full batch reaches the lane with no timer having run."""
    store = JsonlSessionStore(tmp_path, durability="none")
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    text = "x" * 50_000
    for _ in range(400):
        step = add(writer, user(text))
        with pytest.raises(StopIteration):  # completed without suspending
            step.send(None)
        deadline = time.monotonic() + 30
        while writer.pending_bytes >= BATCH_BYTES and time.monotonic() < deadline:
            time.sleep(0.001)  # noqa: ASYNC251 (on purpose: the lane runs, the loop must not)
        assert writer.pending_bytes < BATCH_BYTES, "a full batch never reached the lane"
    await writer.aclose()
    assert len(replay_bytes(writer.path.read_bytes()).messages) == 400
