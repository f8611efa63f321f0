"""The file schedule store's log: firing appends (the file is never rewritten for it), a
crash's torn last line is left out and the next change rewrites the file whole, replaced
lines are compacted away, erasure rewrites at once, a failed append leaves no torn line, and
the due index answers as a walk over every record would."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from pathlib import Path

import pytest

from sessions.schedule_due import REBUILD_SLACK, DueIndex, claimed_time, waiting_time
from sessions.schedule_file import COMPACT_SLACK, SCHEDULES_FILE, FileScheduleStore
from sessions.schedules import Outcome, ScheduleRecord, Target
from tests.sessions.test_schedule_stores import NOW, record
from tests.sessions.test_store import run_python


def claim(r: ScheduleRecord, now: float) -> ScheduleRecord:
    return dataclasses.replace(r, firing=r.next_at, next_at=None)


async def fired(r: ScheduleRecord) -> ScheduleRecord:
    assert r.firing is not None
    return dataclasses.replace(r, firing=None).with_outcome(
        Outcome(r.firing, "fired", NOW)).settled()


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def test_firing_appends_and_another_process_reads_the_same(tmp_path: Path) -> None:
    """Claiming and delivering append one line each to the file as it was (same inode, same
    bytes before them); another store over the folder reads the same records."""
    store = FileScheduleStore(tmp_path / "state")
    for n in range(3):
        await store.add(record(f"s{n}"), per_owner=0, per_tenant=0)
    path = tmp_path / "state" / SCHEDULES_FILE
    before, inode = path.read_bytes(), path.stat().st_ino
    assert await store.claim(NOW, claim, 1) == 1
    assert await store.deliver(NOW, fired, 10) == 1
    data = path.read_bytes()
    assert path.stat().st_ino == inode
    assert data.startswith(before)
    assert [(line["id"], line["state"], line["firing"]) for line in lines(path)[3:]] == [
        ("s0", "active", NOW), ("s0", "done", None)]
    other = FileScheduleStore(tmp_path / "state")
    assert await other.find(None, active_only=False) == \
        await store.find(None, active_only=False)
    assert [(r.id, r.state, r.fired) for r in await other.find(None, active_only=False)] == [
        ("s0", "done", 1), ("s1", "active", 0), ("s2", "active", 0)]


async def test_a_torn_last_line_is_left_out_and_the_next_change_rewrites(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A crash mid-append leaves half a line: it is left out (that change was never
    acknowledged), said once in the log, and the next change rewrites the file whole."""
    store = FileScheduleStore(tmp_path / "state")
    await store.add(record("a"), per_owner=0, per_tenant=0)
    await store.add(record("b"), per_owner=0, per_tenant=0)
    path = tmp_path / "state" / SCHEDULES_FILE
    whole = path.read_bytes()
    claimed = json.dumps({"kind": "schedule", **json.loads(whole.splitlines()[0]),
                          "firing": NOW, "next_at": None}).encode()
    path.write_bytes(whole + claimed[: len(claimed) // 2])  # the crash, mid-append
    fresh = FileScheduleStore(tmp_path / "state")
    with caplog.at_level(logging.WARNING, "sessions.schedule_file"):
        found = await fresh.find("default")
    assert [(r.id, r.firing) for r in found] == [("a", None), ("b", None)]
    assert [m for m in caplog.messages if "unfinished line" in m] == [
        f"{path} ends in an unfinished line (an interrupted write); it is left out"]
    inode = path.stat().st_ino
    await fresh.cancel("default", "b")
    assert path.stat().st_ino != inode  # rewritten, not appended to the torn line
    assert [(line["id"], line["state"]) for line in lines(path)] == [
        ("a", "active"), ("b", "cancelled")]


async def test_replaced_lines_are_compacted_away(tmp_path: Path) -> None:
    """Once the file is over twice its live lines (and COMPACT_SLACK), the next change
    rewrites it with one line per record."""
    store = FileScheduleStore(tmp_path / "state", durable=False)
    await store.add(record("a"), per_owner=0, per_tenant=0)
    await store.add(record("b"), per_owner=0, per_tenant=0)
    path = tmp_path / "state" / SCHEDULES_FILE
    inode, n = path.stat().st_ino, 0
    while path.stat().st_ino == inode:
        n += 1
        await store.put(dataclasses.replace(record("a"), instruction=f"do a, version {n}"))
        assert n < 10_000, "never compacted"
    live = sum(len(line) + 1 for line in path.read_bytes().splitlines())
    assert [(line["id"], line["instruction"]) for line in lines(path)] == [
        ("a", f"do a, version {n}"), ("b", "do b")]
    assert path.stat().st_size == live
    assert n * len(path.read_bytes().splitlines()[0]) > COMPACT_SLACK  # it had grown first


async def test_erasure_takes_every_line_of_the_person_out_of_the_file(tmp_path: Path) -> None:
    """Their schedule's earlier lines (set, claimed, fired) are all gone from the file's bytes
    at once; another person's stay."""
    store = FileScheduleStore(tmp_path / "state")
    await store.add(dataclasses.replace(record("mine"), instruction="call the doctor"),
                    per_owner=0, per_tenant=0)
    await store.add(record("theirs", owner="person:telegram:2",
                           target=Target("telegram", "2", "private", None, "2")),
                    per_owner=0, per_tenant=0)
    await store.claim(NOW, claim, 10)
    await store.deliver(NOW, fired, 10)
    path = tmp_path / "state" / SCHEDULES_FILE
    assert path.read_bytes().count(b"call the doctor") == 3
    assert await store.erase_person("default", "telegram", "1") == ["mine"]
    assert b"call the doctor" not in path.read_bytes()
    assert [line["id"] for line in lines(path)] == ["theirs"]


FSIZE_SCRIPT = """
import asyncio, dataclasses, json, resource, signal, sys
from pathlib import Path
from sessions.schedule_file import FileScheduleStore
from tests.sessions.test_schedule_stores import record

async def main(state):
    store = FileScheduleStore(Path(state))
    path = store.path
    await store.add(record("a"), per_owner=0, per_tenant=0)
    size = path.stat().st_size
    # Past the limit the kernel writes what fits and fails the rest: a real short write.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))
    out = {"size_before": size}
    try:
        await store.put(dataclasses.replace(record("b"), instruction="x" * 4000))
    except OSError as exc:
        out["error"] = exc.errno
    out["size_after"] = path.stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    await store.put(record("c"))
    print(json.dumps(out))

asyncio.run(main(sys.argv[1]))
"""


async def test_a_failed_append_leaves_no_torn_line(tmp_path: Path) -> None:
    """An append cut short by the disk (RLIMIT_FSIZE: EFBIG after a short write) raises and
    cuts the file back; the next change appends after whole lines, and nothing is lost."""
    out = json.loads(await run_python(FSIZE_SCRIPT, str(tmp_path / "state")))
    assert out["error"] == 27  # EFBIG
    assert out["size_after"] == out["size_before"]
    path = tmp_path / "state" / SCHEDULES_FILE
    assert [line["id"] for line in lines(path)] == ["a", "c"]
    found = await FileScheduleStore(tmp_path / "state").find("default")
    assert [r.id for r in found] == ["a", "c"]


def test_the_due_index_answers_as_a_walk_over_every_record_would() -> None:
    """Random changes (claims, holds, deliveries, cancels, deletions, the same record noted
    twice): after each, the earliest times and the due lists equal a brute-force walk, and
    the heaps stay within a few times the records' count."""
    rng = random.Random(32)
    records: dict[tuple[str, str], ScheduleRecord] = {}
    index = DueIndex(records)
    for step in range(3000):
        ident = f"s{rng.randrange(60)}"
        key = ("default", ident)
        current = records.get(key) or record(ident, next_at=NOW + rng.randrange(100))
        roll = rng.random()
        if roll < 0.05:
            records.pop(key, None)  # erased: its entries go stale
            continue
        if roll < 0.3 and current.firing is None and current.next_at is not None:
            changed = claim(current, NOW)
        elif roll < 0.45 and current.firing is not None:
            changed = dataclasses.replace(current, held_until=NOW + rng.randrange(100))
        elif roll < 0.65 and current.firing is not None:
            changed = dataclasses.replace(current, firing=None, held_until=None,
                                          next_at=NOW + rng.randrange(100))
        elif roll < 0.7:
            changed = dataclasses.replace(current, state="cancelled", next_at=None)
        else:
            changed = dataclasses.replace(current, next_at=NOW + rng.randrange(100))
        records[key] = changed
        index.note(changed)
        if rng.random() < 0.1:
            index.note(changed)  # noted twice: still one answer
        now = NOW + rng.randrange(100)
        waiting = sorted((waiting_time(r), r.id) for r in records.values()
                         if waiting_time(r) is not None)
        claimed = sorted((claimed_time(r), r.id) for r in records.values()
                         if claimed_time(r) is not None)
        assert index.earliest() == (waiting[0][0] if waiting else None,
                                    claimed[0][0] if claimed else None), step
        due_claimed = sorted((r for r in records.values() if (t := claimed_time(r)) is not None
                              and t <= now), key=lambda r: (r.firing or 0.0, r.id))[:5]
        assert index.claimed_due(now, 5) == due_claimed, step
        assert index.entries <= 2 * len(records) + REBUILD_SLACK + 2
    due = [r for t, i in waiting if t is not None and t <= NOW + 50
           for r in [records[("default", i)]]][:7]
    assert index.waiting_due(NOW + 50, 7) == due
