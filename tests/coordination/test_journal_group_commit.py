"""The owed journal's fsyncs are shared (group commit): answers noted while an fsync runs wait
for it and share the next one, and none returns before an fsync that began after its line."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from coordination.journal import FileJournal

WAIT = 30.0  # seconds; only a broken test ever waits this long


class HeldFsync:
    """The disk's fsync, recording (into ``events``) the file size each one saw at its start
    and its end; the first one is held until :meth:`release`."""

    def __init__(self, path: Path, events: list[tuple[str, object]]) -> None:
        self.path = path
        self.events = events
        self.started = threading.Event()
        self.gate = threading.Event()
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        number = self.calls
        self.events.append(("fsync start", self.path.stat().st_size))
        if number == 1:
            self.started.set()
            if not self.gate.wait(WAIT):
                raise AssertionError("the first fsync was never released")
        os.fsync(fd)
        self.events.append(("fsync end", number))

    def release(self) -> None:
        self.gate.set()


def line_count(path: Path) -> int:
    # A few hundred bytes of a local file: reading it inline cannot hold the test's loop.
    return path.read_bytes().count(b"\n")


async def settle(journal_path: Path, lines: int) -> None:
    """Let the ready tasks run until the file holds ``lines`` lines (bounded)."""
    for _ in range(10_000):
        if line_count(journal_path) >= lines:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the file never reached {lines} lines")


async def test_answers_noted_during_an_fsync_share_the_next_one(tmp_path: Path) -> None:
    """Six answers, five noted while the first one's fsync runs: two fsyncs in all, the
    second begun after all five lines were written, and each answer returns after the fsync
    that covers it."""
    path = tmp_path / "state" / "delivery.jsonl"
    events: list[tuple[str, object]] = []
    fsync = HeldFsync(path, events)
    journal = FileJournal(path, sync_file=fsync)
    await journal.open()
    ids = [f"i{n}" for n in range(6)]
    for item in ids:
        await journal.owe(item, f"conv-{item}", f"k-{item}", "body")

    async def answer(item: str) -> None:
        await journal.paid(item, "s")
        events.append(("returned", item))

    first = asyncio.create_task(answer(ids[0]))
    try:
        assert await asyncio.to_thread(fsync.started.wait, WAIT)
        after_first = path.stat().st_size
        rest = [asyncio.create_task(answer(item)) for item in ids[1:]]
        await settle(path, 12)  # six owe lines, six paid lines
        all_written = path.stat().st_size
    finally:
        fsync.release()
    async with asyncio.timeout(WAIT):
        await asyncio.gather(first, *rest)
    journal.close()

    assert events == [
        ("fsync start", after_first), ("fsync end", 1), ("returned", "i0"),
        ("fsync start", all_written), ("fsync end", 2),
        *(("returned", item) for item in ids[1:]),
    ]


async def test_a_cancelled_answer_does_not_strand_the_others(tmp_path: Path) -> None:
    """The answer whose fsync is running is cancelled: one waiting behind it starts the next
    fsync itself (in the sync lane, after the running one) and returns once that one has
    ended."""
    path = tmp_path / "state" / "delivery.jsonl"
    events: list[tuple[str, object]] = []
    fsync = HeldFsync(path, events)
    journal = FileJournal(path, sync_file=fsync)
    await journal.open()
    for item in ("i0", "i1"):
        await journal.owe(item, f"conv-{item}", None, "body")
    first = asyncio.create_task(journal.paid("i0", "s"))
    try:
        assert await asyncio.to_thread(fsync.started.wait, WAIT)
        second = asyncio.create_task(journal.paid("i1", "s"))
        await settle(path, 4)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        for _ in range(100):  # the second takes over and asks for its own fsync
            await asyncio.sleep(0)
        assert not second.done()  # behind the held one, never sharing it
    finally:
        fsync.release()
    async with asyncio.timeout(WAIT):
        await second
    events.append(("returned", "i1"))
    journal.close()
    assert first.cancelled()
    assert events == [("fsync start", events[0][1]), ("fsync end", 1),
                      ("fsync start", path.stat().st_size), ("fsync end", 2), ("returned", "i1")]


async def test_no_fsync_with_durability_none(tmp_path: Path) -> None:
    """``fsync="none"``: answers are written and never fsynced."""
    path = tmp_path / "state" / "delivery.jsonl"
    fsync = HeldFsync(path, [])
    fsync.release()
    journal = FileJournal(path, fsync="none", sync_file=fsync)
    await journal.open()
    await journal.owe("i0", "conv", None, "body")
    await journal.paid("i0", "s")
    journal.close()
    assert fsync.calls == 0
    assert line_count(path) == 2
