"""The owed journal of one process: what it keeps across restarts, how it fails, how it
stays small (issue 18 item 15: keys expire after their ttl and the file is rewritten from what
is live, checked with a fake clock)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import orjson
import pytest

from coordination.journal import COMPACT_SLACK, FileJournal
from gateway.edge.errors import ConfigError
from tests.fakes.reserve import RoomOnRelease

HOUR = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def lines(path: Path) -> list[list[object]]:
    return [orjson.loads(raw) for raw in path.read_bytes().splitlines()]


async def test_owed_items_and_keys_survive_a_restart(tmp_path: Path) -> None:
    """Owed items come back in arrival order; answered and withdrawn ones do not; a key is
    recognised after the restart with the session its item was answered in."""
    path = tmp_path / "state" / "delivery.jsonl"
    journal = FileJournal(path)
    await journal.open()
    await journal.owe("i1", "conv-a", "k1", "body 1")
    await journal.owe("i2", "conv-b", "k2", "body 2")
    await journal.owe("i3", "conv-a", None, "body 3")
    await journal.owe("i4", "conv-a", "k4", "body 4")
    await journal.paid("i1", "s-a")
    await journal.drop("i4")
    journal.close()

    again = FileJournal(path)
    await again.open()
    assert [(o.id, o.conversation, o.item) for o in again.owed()] == [
        ("i2", "conv-b", "body 2"), ("i3", "conv-a", "body 3")]
    assert again.seen("k1") == ("i1", "s-a")
    assert again.seen("k2") == ("i2", None)
    assert again.seen("k4") is None  # withdrawn: a redelivery is taken
    assert again.paid_session("i1") == (True, "s-a")
    again.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


async def test_a_torn_last_line_is_cut_before_anything_is_appended(tmp_path: Path) -> None:
    """A line cut by a kill is ignored, and the next line does not run into it."""
    path = tmp_path / "delivery.jsonl"
    journal = FileJournal(path)
    await journal.open()
    await journal.owe("i1", "c", "k1", "one")
    journal.close()
    with path.open("ab") as fh:
        fh.write(b'["owe","i2","c","k2",1.0,"tw')  # killed mid-write
    again = FileJournal(path)
    await again.open()
    await again.owe("i3", "c", "k3", "three")
    again.close()
    third = FileJournal(path)
    await third.open()
    assert [o.id for o in third.owed()] == ["i1", "i3"]
    third.close()


async def test_an_owe_that_cannot_be_written_records_nothing(tmp_path: Path) -> None:
    """A failed ``owe`` raises and leaves nothing behind; a failed ``paid`` is kept and
    written by the next write (here a ``flush``), once the disk takes writes again."""
    path = tmp_path / "delivery.jsonl"
    disk = RefusingDisk()
    journal = FileJournal(path, write_file=disk.write)
    await journal.open()
    await journal.owe("i1", "c", "k1", "one")
    disk.refusing = True  # every write now fails (EBADF)
    with pytest.raises(OSError, match="Bad file descriptor") as failed:
        await journal.owe("i2", "c", "k2", "two")
    assert failed.value.errno == errno.EBADF
    assert journal.seen("k2") is None
    await journal.paid("i1", "s1")  # never raises: kept for later
    assert journal.pending_bytes > 0
    assert not await journal.flush()
    disk.refusing = False
    assert await journal.flush()
    journal.close()
    assert [line[0] for line in lines(path)] == ["owe", "paid"]


async def test_a_second_process_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    """The journal is locked while open: one gateway process per data directory."""
    first = FileJournal(tmp_path / "delivery.jsonl")
    await first.open()
    with pytest.raises(ConfigError, match="another gateway process"):
        await FileJournal(tmp_path / "delivery.jsonl").open()
    first.close()


async def test_keys_expire_and_the_file_stays_proportional_to_live_ones(
        tmp_path: Path) -> None:
    """55 hours of traffic (a message every 10 s, answered at once) with a 25 h ttl: the
    keys held are those of the last 25 hours and the file never holds more than twice them
    plus the slack; after a restart it holds exactly the live ones."""
    clock = Clock()
    path = tmp_path / "delivery.jsonl"
    journal = FileJournal(path, ttl=25 * HOUR, clock=clock, fsync="none")
    await journal.open()
    every = 10.0
    most_lines = 0
    for n in range(int(55 * HOUR / every)):
        clock.now += every
        await journal.owe(f"i{n}", "c", f"k{n}", "body")
        await journal.paid(f"i{n}", "s")
        if journal.compacting is not None:  # rewritten in a thread: this loop never yields
            await journal.compacting
        if n % 50 == 0:
            most_lines = max(most_lines, path.read_bytes().count(b"\n"))
    live = int(25 * HOUR / every)
    held = len(journal)
    assert live - 1 <= held <= live + COMPACT_SLACK
    assert most_lines <= 2 * (live + COMPACT_SLACK) + COMPACT_SLACK + 2
    assert journal.seen("k0") is None  # 55 h old
    assert journal.seen(f"k{n}") == (f"i{n}", "s")
    journal.close()
    again = FileJournal(path, ttl=25 * HOUR, clock=clock, fsync="none")
    await again.open()
    assert path.read_bytes().count(b"\n") == len(again) <= live
    again.close()


class FullDisk:
    """The journal's append on a disk that is full until room is given back (the reserve)."""

    def __init__(self) -> None:
        self.full = False

    def make_room(self) -> None:
        self.full = False

    def write(self, fd: int, data: memoryview) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)


@pytest.mark.parametrize("room", [True, False])
async def test_the_stop_writes_the_notes_of_answers_sent_into_the_reserve(
        tmp_path: Path, room: bool) -> None:
    """A ``paid`` the full disk refused is written at the stop (``settle``) once the reserve
    gives room back; without room it stays unwritten (the next start answers it again) and
    ``settle`` says so."""
    path = tmp_path / "delivery.jsonl"
    disk = FullDisk()
    journal = FileJournal(path, write_file=disk.write,
                          reserve=RoomOnRelease(disk.make_room if room else None))
    await journal.open()
    await journal.owe("i1", "c", "k1", "one")
    disk.full = True
    await journal.paid("i1", "s1")  # the reply went out; the note is kept in memory
    assert journal.pending_bytes > 0
    assert await journal.settle() is room
    journal.close()
    assert [line[0] for line in lines(path)] == (["owe", "paid"] if room else ["owe"])
    reopened = FileJournal(path)
    await reopened.open()
    assert [o.id for o in reopened.owed()] == ([] if room else ["i1"])
    reopened.close()


class RefusingDisk:
    """Appends that fail with EBADF while ``refusing`` (as on a descriptor gone bad)."""

    def __init__(self) -> None:
        self.refusing = False

    def write(self, fd: int, data: memoryview) -> int:
        if self.refusing:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return os.write(fd, data)


class TornDisk:
    """Appends that stop half-way (ENOSPC after some bytes), and cut-backs that may fail."""

    def __init__(self) -> None:
        self.tear = False
        self.short_written = False
        self.cut_fails = False
        self.cuts: list[int] = []

    def write(self, fd: int, data: memoryview) -> int:
        if self.tear:
            if not self.short_written:
                self.short_written = True
                return os.write(fd, data[:5])  # a short write; the next one finds no room
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def truncate(self, fd: int, size: int) -> None:
        self.cuts.append(size)
        if self.cut_fails:
            raise OSError(errno.EIO, "Input/output error")
        os.ftruncate(fd, size)


@pytest.mark.parametrize("cut_fails", [False, True])
async def test_a_torn_append_is_cut_back_before_the_next_line(tmp_path: Path,
                                                               cut_fails: bool) -> None:
    """An append that stops half-way leaves no torn bytes for the next line to be glued to:
    they are cut at once, or (when that fails too) before the next append. After a compaction
    the cut goes to the new file's size, not the old one's."""
    path = tmp_path / "delivery.jsonl"
    disk = TornDisk()
    journal = FileJournal(path, write_file=disk.write, truncate_file=disk.truncate)
    await journal.open()
    await journal.owe("i1", "c", "k1", "one")
    await journal.paid("i1", "s1")
    journal.compact_now()  # the file now holds one "seen#" line
    whole = path.stat().st_size
    disk.tear, disk.cut_fails = True, cut_fails
    with pytest.raises(OSError, match="No space left"):
        await journal.owe("i2", "c", "k2", "two")
    assert disk.cuts == [whole]
    assert path.stat().st_size == (whole + 5 if cut_fails else whole)
    disk.tear = disk.cut_fails = False
    await journal.owe("i3", "c", "k3", "three")
    assert disk.cuts == ([whole, whole] if cut_fails else [whole])
    journal.close()
    assert [line[0] for line in lines(path)] == ["seen#", "owe"]
    reopened = FileJournal(path)
    await reopened.open()
    assert [o.id for o in reopened.owed()] == ["i3"]
    reopened.close()


async def test_erase_rewrites_the_file_without_the_persons_lines(tmp_path: Path) -> None:
    """An erasure drops the answered items of the person's sessions and the named items
    (their text and keys) from memory and rewrites the file at once; another person's
    answered key and an item still owed stay; a dry run counts the same lines and changes
    nothing; a restart reads back what stayed."""
    path = tmp_path / "state" / "delivery.jsonl"
    journal = FileJournal(path)
    await journal.open()
    await journal.owe("a1", "dm-ada", "k-a1", "a1 ada's secret in a DM")
    await journal.paid("a1", "s-ada")
    await journal.owe("g1", "team", "k-g1", "g1 ada's secret in the group")
    await journal.paid("g1", "s-team")
    await journal.owe("b1", "dm-bob", "k-b1", "b1 bob's words")
    await journal.paid("b1", "s-bob")
    await journal.owe("a2", "dm-ada", "k-a2", "a2 ada, still owed")
    before = path.read_bytes()
    assert await journal.erase({"s-ada"}, {"g1"}, dry=True) == 4
    assert path.read_bytes() == before
    assert await journal.erase({"s-ada"}, {"g1"}) == 4
    data = path.read_bytes()
    assert b"secret" not in data
    assert (journal.seen("k-a1"), journal.seen("k-g1")) == (None, None)
    assert journal.seen("k-b1") == ("b1", "s-bob")
    assert [o.id for o in journal.owed()] == ["a2"]
    await journal.paid("a2", "s-ada2")  # appends go on to the new file
    journal.close()
    again = FileJournal(path)
    await again.open()
    assert again.seen("k-b1") == ("b1", "s-bob")
    assert again.seen("k-a2") == ("a2", "s-ada2")
    assert again.seen("k-a1") is None
    again.close()
