"""The disk reserve: room held while there is some, given back once when a close meets a full
disk, so the session entries of answers already sent are written instead of dropped (issue 12,
item 3: nothing written is dropped, a stop while the disk is full included)."""

from __future__ import annotations

import errno
import logging
import stat
from pathlib import Path

import pytest

from sessions.jsonl import JsonlSessionStore
from sessions.replay import replay_bytes
from sessions.reserve import DiskReserve
from tests.fakes.disk import FaultyDisk
from tests.fakes.reserve import RoomOnRelease
from tests.sessions.helpers import add, user

SIZE = 256 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_reserve_holds_allocated_private_room_and_gives_it_back_once(tmp_path: Path) -> None:
    """ensure() makes a 0600 file in a 0700 folder whose blocks are really allocated (not a
    sparse file: deleting it must free room); release() deletes it and says so once."""
    reserve = DiskReserve(tmp_path / "state" / "reserve", SIZE)
    assert reserve.ensure()
    info = reserve.path.stat()
    assert info.st_size == SIZE
    assert info.st_blocks * 512 >= SIZE
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert stat.S_IMODE(reserve.path.parent.stat().st_mode) == 0o700
    assert reserve.release()
    assert not reserve.path.exists()
    assert not reserve.release()  # nothing held any more
    assert reserve.ensure()
    assert reserve.path.exists()


def test_a_reserve_left_by_the_last_run_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "reserve"
    first = DiskReserve(path, SIZE)
    assert first.ensure()
    inode = path.stat().st_ino
    second = DiskReserve(path, SIZE)  # the next start
    assert second.ensure()
    assert path.stat().st_ino == inode
    assert second.release()
    assert not path.exists()


def test_no_room_is_retried_only_after_retry_after(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A reserve that cannot be made (here its folder cannot be: a file is in the way) warns,
    and is not tried again on every session creation, only after ``retry_after``."""
    blocker = tmp_path / "state"
    blocker.write_text("not a folder")
    clock = Clock()
    reserve = DiskReserve(blocker / "reserve", SIZE, retry_after=30.0, clock=clock)
    with caplog.at_level(logging.WARNING, "sessions.reserve"):
        assert not reserve.ensure()
    assert "no room for the disk reserve" in caplog.text
    blocker.unlink()  # there is room now, but it is not looked at yet
    clock.now += 29.0
    assert not reserve.ensure()
    assert not (blocker / "reserve").exists()
    clock.now += 1.0
    assert reserve.ensure()
    assert (blocker / "reserve").stat().st_size == SIZE


def test_size_zero_holds_nothing(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path / "reserve", 0)
    assert not reserve.ensure()
    assert not reserve.path.exists()
    assert not reserve.release()


@pytest.mark.parametrize("with_reserve", [True, False])
async def test_a_close_on_a_full_disk_writes_into_the_released_reserve(
        tmp_path: Path, with_reserve: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Entries accepted while the disk is full (the turn went on) are written at close once
    the reserve gives room back; without a reserve they are lost, and the log says so."""
    disk = FaultyDisk()
    reserve = RoomOnRelease(disk.recover)
    store = JsonlSessionStore(tmp_path, durability="turn", ops=disk,
                              reserve=reserve if with_reserve else None)
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await add(writer, user("before"))
    await writer.flush()
    disk.fail(OSError(errno.ENOSPC, "No space left on device"))
    for text in ("answered 1", "answered 2"):
        await add(writer, user(text))  # accepted: the writer reports the failure, keeps it
    assert writer.pending_bytes > 0
    with caplog.at_level(logging.WARNING, "sessions.jsonl_writer"):
        await writer.aclose()

    texts = [m["content"] for m in replay_bytes(writer.path.read_bytes()).messages]
    if with_reserve:
        assert texts == ["before", "answered 1", "answered 2"]
        assert reserve.releases == 1
        assert "lost" not in caplog.text
    else:
        assert texts == ["before"]
        assert "unwritten bytes lost at close (ENOSPC)" in caplog.text


async def test_a_close_on_a_read_only_disk_keeps_the_reserve(tmp_path: Path) -> None:
    """Room does not cure EROFS: the reserve stays held for a full disk later."""
    disk = FaultyDisk()
    reserve = RoomOnRelease(disk.recover)
    store = JsonlSessionStore(tmp_path, durability="turn", ops=disk,
                              reserve=reserve)
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    disk.fail(OSError(errno.EROFS, "Read-only file system"))
    await add(writer, user("kept in memory"))
    await writer.aclose()
    assert reserve.held
    assert reserve.releases == 0


async def test_the_store_makes_the_reserve_with_its_first_session(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path / "state" / "reserve", SIZE)
    store = JsonlSessionStore(tmp_path, reserve=reserve)
    assert not reserve.path.exists()
    writer = await store.create(channel="console", conversation="c", session_id="s1")
    await writer.aclose()
    assert reserve.held
    assert reserve.path.stat().st_size == SIZE
