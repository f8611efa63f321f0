"""The owed journal's rewrite runs in a thread: the event loop goes on appending meanwhile,
what it appended reaches the new file, and no answer counts as durable on the strength of a
file about to be replaced."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
from pathlib import Path

import pytest

from coordination.journal import FileJournal
from tests.waiting import until

WAIT = 30.0  # seconds; only a broken test ever waits this long


class HeldSync:
    """An fsync that, once :meth:`arm`-ed (after the journal's open, which rewrites too),
    records each call's descriptor and holds call number ``hold`` until :meth:`release`;
    ``fail`` makes every armed call raise ENOSPC instead."""

    def __init__(self, hold: int = 1, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.hold = hold
        self.fail = fail
        self.armed = False
        self.entered = threading.Event()
        self.gate = threading.Event()

    def arm(self) -> None:
        self.armed = True

    def __call__(self, fd: int) -> None:
        if not self.armed:
            os.fsync(fd)
            return
        self.calls.append(fd)
        if self.fail:
            raise OSError(errno.ENOSPC, "No space left on device")
        if len(self.calls) == self.hold:
            self.entered.set()
            if not self.gate.wait(WAIT):
                raise AssertionError("the held fsync was never released")
        os.fsync(fd)

    def release(self) -> None:
        self.gate.set()


@pytest.fixture(autouse=True)
def small_slack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("coordination.journal.COMPACT_SLACK", 4)


KEYED = 3
"""Answers below this number carry a platform key (remembered: live lines a rewrite keeps);
the others none (nothing left live once answered, so the file soon needs a rewrite)."""


async def answer(journal: FileJournal, n: int) -> None:
    await journal.owe(f"i{n}", "c", f"k{n}" if n < KEYED else None, "body")
    await journal.paid(f"i{n}", "s")


async def answer_until_compacting(journal: FileJournal) -> int:
    for n in range(100):
        await answer(journal, n)
        if journal.compacting is not None:
            return n + 1
    raise AssertionError("no rewrite started")


def state(journal: FileJournal, keys: range) -> tuple[list[str], list[object]]:
    """The owed items, and what each key's delivery got (None past KEYED: no key)."""
    return [o.id for o in journal.owed()], [journal.seen(f"k{n}") for n in keys]


async def test_the_loop_appends_during_a_rewrite_and_the_new_file_has_it_all(
        tmp_path: Path) -> None:
    path = tmp_path / "state" / "delivery.jsonl"
    rewrite = HeldSync(hold=1)
    journal = FileJournal(path, fsync="none", sync_rewrite=rewrite)
    await journal.open()
    rewrite.arm()
    first = await answer_until_compacting(journal)
    assert await asyncio.to_thread(rewrite.entered.wait, WAIT)  # the new file's fsync, held
    old_inode = path.stat().st_ino
    # The rewrite holds its thread; this loop goes on (were it blocked, so would this test).
    for n in range(first, first + 5):
        await answer(journal, n)
    await journal.owe("open", "c", "k-open", "body")  # owed, not answered
    assert b'"open"' in path.read_bytes()  # in the old file, for now
    rewrite.release()
    compaction = journal.compacting
    assert compaction is not None
    await asyncio.wait_for(compaction, WAIT)
    assert path.stat().st_ino != old_inode  # replaced
    assert not (path.parent / f".{path.name}.tmp").exists()
    assert len(rewrite.calls) == 2  # the snapshot, then again with what came meanwhile
    await journal.owe("after", "c", "k-after", "body")  # appended to the new file
    expected = state(journal, range(first + 5))
    journal.close()
    again = FileJournal(path, fsync="none")
    await again.open()
    assert state(again, range(first + 5)) == expected
    assert expected[0] == ["open", "after"]
    assert expected[1][:KEYED] == [(f"i{n}", "s") for n in range(KEYED)]
    again.close()


async def test_an_answer_noted_during_the_last_fsync_is_synced_in_the_new_file(
        tmp_path: Path) -> None:
    path = tmp_path / "state" / "delivery.jsonl"
    rewrite = HeldSync(hold=2)  # the second fsync: the new file with what came meanwhile
    synced: list[int] = []
    journal = FileJournal(path, sync_file=synced.append, sync_rewrite=rewrite)
    await journal.open()
    rewrite.arm()
    await answer_until_compacting(journal)
    assert await asyncio.to_thread(rewrite.entered.wait, WAIT)
    await journal.owe("late", "c", "k-late", "body")
    synced.clear()
    late = asyncio.create_task(journal.paid("late", "s"))
    for _ in range(100):
        await asyncio.sleep(0)
    assert not late.done()  # not on an fsync of the file being replaced
    assert synced == []
    rewrite.release()
    await asyncio.wait_for(late, WAIT)
    assert journal.fileno() is not None
    assert synced == [journal.fileno()]  # the new file, which holds its line
    assert b'"late"' in path.read_bytes()
    journal.close()


async def test_a_failed_rewrite_leaves_the_old_file_and_the_journal_working(
        tmp_path: Path) -> None:
    path = tmp_path / "state" / "delivery.jsonl"
    rewrite = HeldSync(fail=True)
    journal = FileJournal(path, fsync="none", sync_rewrite=rewrite)
    await journal.open()
    rewrite.arm()
    first = await answer_until_compacting(journal)
    compaction = journal.compacting
    assert compaction is not None
    await asyncio.wait_for(compaction, WAIT)
    assert not (path.parent / f".{path.name}.tmp").exists()
    lines_before = path.read_bytes().count(b"\n")
    assert lines_before >= 2 * first  # nothing was dropped from the old file
    rewrite.fail = False
    for n in range(first, first + 3):
        await answer(journal, n)
        if journal.compacting is not None:
            await asyncio.wait_for(journal.compacting, WAIT)
    assert path.read_bytes().count(b"\n") < lines_before  # a later rewrite went through
    expected = state(journal, range(first + 3))
    journal.close()
    again = FileJournal(path, fsync="none")
    await again.open()
    assert state(again, range(first + 3)) == expected
    again.close()


def open_to(path: Path) -> list[int]:
    """This process's descriptors open on ``path`` (by name, or by name once deleted)."""
    found = []
    for entry in os.scandir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(entry.path)
            if target in (str(path), f"{path} (deleted)"):
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("hold", [1, 2], ids=["writing-the-snapshot", "syncing-the-tail"])
async def test_a_close_during_a_rewrite_leaves_no_descriptor_and_no_temporary_file(
        tmp_path: Path, hold: int) -> None:
    """Closed while a rewrite's thread is inside its first or second step (at a stop that did
    not settle), the journal leaves neither the new file nor a descriptor on it behind once
    the thread ends; the old file is as it was, and a restart reads it."""
    path = tmp_path / "state" / "delivery.jsonl"
    tmp = path.parent / f".{path.name}.tmp"
    rewrite = HeldSync(hold=hold)
    journal = FileJournal(path, fsync="none", sync_rewrite=rewrite)
    await journal.open()
    rewrite.arm()
    first = await answer_until_compacting(journal)
    assert await asyncio.to_thread(rewrite.entered.wait, WAIT)
    assert open_to(tmp)  # the rewrite's new file, open in its thread
    expected = state(journal, range(first))
    compaction = journal.compacting
    assert compaction is not None
    journal.close()
    rewrite.release()
    await asyncio.wait([compaction], timeout=WAIT)
    # The thread's end reaches the loop as a callback.
    await until(lambda: not tmp.exists() and not open_to(tmp))
    assert not tmp.exists()
    assert open_to(tmp) == []
    again = FileJournal(path, fsync="none")
    await again.open()
    assert state(again, range(first)) == expected
    again.close()
