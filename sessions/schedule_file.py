"""The schedules of one gateway process: a file of its own under the data folder.

``<data>/state/schedules.jsonl`` (0600 in a 0700 folder): one JSON object per line, a
schedule (:func:`sessions.schedules.to_json`, ``"kind": "schedule"``) or a person's time zone
(``"kind": "zone"``). The file is a log: a later line of a schedule replaces its earlier ones.

**Changes are appended.** Firing a schedule (the claim, then the outcome), adding, replacing
and cancelling one append the changed records' lines to the end of the file (one ``write``,
then ``fdatasync``), never rewriting it: at 100 occurrences a second over 10,000 schedules,
rewriting a 4 MB file twice per round was most of the firing lag. A crash mid-append can leave
a last line without its newline: it is left out when the file is read (that change was never
acknowledged: its fsync had not returned), and the next change rewrites the file whole. An
append that fails (the disk is full) cuts the file back to where it was.

**Compaction** rewrites the file whole, atomically: a temporary file beside it, written,
fsynced, renamed over it, the folder fsynced; a crash leaves the old file or the new one,
never half of either. It runs when the replaced lines outweigh the live ones (the file is over
twice their size, and over 64 KiB), and for the changes that must take data out of the file at
once: erasing a person (their lines must not linger in the log), and a time zone set or
removed. Each record's line is kept encoded, so a compaction re-encodes nothing.

The gateway and the operator's ``gateway schedule`` may change it at the same time: every
change holds an ``flock`` on ``schedules.lock`` from reading to writing, and reads the file
again first when it changed since this process last read or wrote it (inode, size, mtime).
The running gateway notices the operator's changes at its next poll (:meth:`next_due`).

All file work runs in a thread, never on the event loop. The store implements
:class:`gateway.schedule.store.ScheduleStore` (see there for the firing steps).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson

from sessions.files import FILE_MODE, ensure_private_dir, read_regular, sync_dir, write_all
from sessions.schedule_due import DueIndex
from sessions.schedules import (
    ScheduleLimitError,
    ScheduleRecord,
    belongs_to,
    from_json,
    to_json,
)

log = logging.getLogger(__name__)

SCHEDULES_FILE = "schedules.jsonl"
LOCK_FILE = "schedules.lock"
COMPACT_SLACK = 64 * 1024
"""Bytes of replaced lines the file may carry beyond its live ones before a compaction."""
T = TypeVar("T")
Key = tuple[str, str]
Plan = Callable[[ScheduleRecord, float], ScheduleRecord]
Deliver = Callable[[ScheduleRecord], Awaitable[ScheduleRecord]]


class FileScheduleStore:
    """See the module docstring. ``state_dir`` is ``<data>/state``; ``durable=False`` skips
    the fsyncs (``GATEWAY_DURABILITY=none``)."""

    def __init__(self, state_dir: Path, *, durable: bool = True) -> None:
        self.path = state_dir / SCHEDULES_FILE
        self._lock_path = state_dir / LOCK_FILE
        self.durable = durable
        self._records: dict[Key, ScheduleRecord] = {}
        self._lines: dict[Key, bytes] = {}
        self._zones: dict[Key, str] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._loaded = False
        self._live = 0
        """Bytes the records' current lines take (with their newlines): what a compaction
        would write, less the zones."""
        self._dirty: list[Key] = []
        """Records changed by the change under way: the lines it appends."""
        self._compact = False
        """The next change rewrites the file whole (a torn last line was found)."""
        self._index = DueIndex(self._records)
        """What is due when (:mod:`sessions.schedule_due`): an idle poll costs a ``stat``
        and a look at two heaps' tops, a firing round no walk over every record."""
        self._busy = asyncio.Lock()  # one change at a time from this process
        # File work still running in its thread after its caller was cancelled (a thread
        # cannot be stopped): aclose waits for it, so nothing is written after the close.
        self._inflight: set[asyncio.Future[Any]] = set()

    def __repr__(self) -> str:
        return f"FileScheduleStore({str(self.path)!r})"

    # -- reading ------------------------------------------------------------------------------

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _refresh(self) -> None:
        """Read the file again if it is not the one this process last read or wrote."""
        stamp = self._stat()
        if self._loaded and stamp == self._stamp:
            return
        records: dict[Key, ScheduleRecord] = {}
        lines: dict[Key, bytes] = {}
        zones: dict[Key, str] = {}
        data = read_regular(self.path) if stamp is not None else b""
        body, _, torn = data.rpartition(b"\n")
        self._compact = bool(torn.strip())
        if self._compact:
            # A crash cut the last append short: that change was never acknowledged.
            log.warning("%s ends in an unfinished line (an interrupted write); it is left "
                        "out", self.path)
        for number, raw in enumerate(body.split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                line = orjson.loads(raw)
                if line.get("kind") == "zone":
                    zones[(str(line["tenant"]), str(line["person"]))] = str(line["zone"])
                    continue
                record = from_json(line)
            except (orjson.JSONDecodeError, ValueError, KeyError, AttributeError) as exc:
                # A line no version wrote: kept out, never silently rewritten away unseen.
                log.error("%s line %d is not a schedule (%s); it is left out", self.path,
                          number, type(exc).__name__)
                continue
            key = (record.tenant, record.id)
            records[key] = record  # a later line replaces the earlier ones
            lines[key] = raw
        self._records, self._lines, self._zones = records, lines, zones
        self._live = sum(len(line) + 1 for line in lines.values())
        self._index = DueIndex(records)
        self._stamp = stamp
        self._loaded = True

    async def _read(self, work: Callable[[], T]) -> T:
        def run() -> T:
            with self._flock():
                self._refresh()
                return work()

        async with self._busy:
            return await self._thread(run)

    async def _thread(self, run: Callable[[], T]) -> T:
        future = asyncio.ensure_future(asyncio.to_thread(run))
        self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        return await asyncio.shield(future)

    # -- writing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _flock(self) -> Iterator[None]:
        ensure_private_dir(self.path.parent)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _set(self, record: ScheduleRecord) -> None:
        key = (record.tenant, record.id)
        self._records[key] = record
        self._index.note(record)
        line = orjson.dumps({"kind": "schedule", **to_json(record)})
        self._live += len(line) - len(self._lines.get(key, b"\n")) + 1
        self._lines[key] = line
        self._dirty.append(key)

    def _drop(self, key: Key) -> None:
        del self._records[key]  # its entries in the index go stale
        self._live -= len(self._lines.pop(key)) + 1

    def _write(self) -> None:
        """Compaction: the whole file, rewritten atomically (see the module docstring)."""
        zones = [orjson.dumps({"kind": "zone", "tenant": t, "person": p, "zone": z})
                 for (t, p), z in sorted(self._zones.items())]
        body = b"".join(line + b"\n" for line in [*self._lines.values(), *zones])
        folder = self.path.parent
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            try:
                os.fchmod(fd, FILE_MODE)
                write_all(fd, body)
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            # What this process holds may now differ from the file: read it again next time.
            self._loaded = False
            raise
        if self.durable:
            sync_dir(folder)
        self._stamp = self._stat()
        self._compact = False

    def _append(self, keys: list[Key]) -> None:
        """The current lines of ``keys`` (each once, in order), appended and made durable."""
        unique = dict.fromkeys(k for k in keys if k in self._lines)
        body = b"".join(self._lines[key] + b"\n" for key in unique)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            try:
                write_all(fd, body)
                if self.durable:
                    os.fdatasync(fd)
            except BaseException:
                self._loaded = False  # read it again next time, whatever became of it
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)  # no torn line left for the next append
                raise
        finally:
            os.close(fd)
        self._stamp = self._stat()

    def _save(self, *, rewrite: bool) -> None:
        """Write what the change under way did: appended, or the file compacted."""
        keys, self._dirty = self._dirty, []
        if not rewrite and not keys:
            return  # nothing changed
        size = self._stamp[1] if self._stamp is not None else None
        if (rewrite or self._compact or size is None
                or size > 2 * self._live + COMPACT_SLACK):
            self._write()
        else:
            self._append(keys)

    async def _change(self, work: Callable[[], T], *, rewrite: bool = False) -> T:
        """Run ``work`` on fresh records under the lock, then write what it changed (if it
        returned without raising): appended, or (``rewrite``) the file compacted."""
        def run() -> T:
            with self._flock():
                self._refresh()
                self._dirty = []
                try:
                    result = work()
                except BaseException:
                    self._loaded = False  # a half-applied change is thrown away
                    raise
                self._save(rewrite=rewrite)
                return result

        async with self._busy:
            return await self._thread(run)

    # -- the store ----------------------------------------------------------------------------

    async def add(self, record: ScheduleRecord, *, per_owner: int, per_tenant: int) -> None:
        def work() -> None:
            active = [r for r in self._records.values()
                      if r.tenant == record.tenant and r.active]
            if per_owner and sum(r.owner == record.owner for r in active) >= per_owner:
                raise ScheduleLimitError(f"at most {per_owner} active schedules each")
            if per_tenant and len(active) >= per_tenant:
                raise ScheduleLimitError(f"at most {per_tenant} active schedules here")
            if (record.tenant, record.id) in self._records:
                raise ValueError(f"schedule {record.id} exists already")
            self._set(record)

        await self._change(work)

    async def put(self, record: ScheduleRecord) -> None:
        await self._change(lambda: self._set(record))

    async def get(self, tenant: str, schedule_id: str) -> ScheduleRecord | None:
        return await self._read(lambda: self._records.get((tenant, schedule_id)))

    async def find(self, tenant: str | None = None, *, owner: str | None = None,
                   active_only: bool = True) -> list[ScheduleRecord]:
        def work() -> list[ScheduleRecord]:
            found = [r for r in self._records.values()
                     if (tenant is None or r.tenant == tenant)
                     and (owner is None or r.owner == owner)
                     and (r.active or not active_only)]
            return sorted(found, key=lambda r: (r.created_at, r.id))

        return await self._read(work)

    async def cancel(self, tenant: str, schedule_id: str, *,
                     owner: str | None = None) -> ScheduleRecord | None:
        def work() -> ScheduleRecord | None:
            found = self._records.get((tenant, schedule_id))
            if found is None or not found.active or (owner is not None
                                                     and found.owner != owner):
                return None
            cancelled = dataclasses.replace(found, state="cancelled", next_at=None)
            self._set(cancelled)
            return cancelled

        return await self._change(work)

    async def erase_person(self, tenant: str, channel: str, person: str) -> list[str]:
        def work() -> list[str]:
            doomed = [key for key, r in self._records.items()
                      if r.tenant == tenant and belongs_to(r, channel, person)]
            for key in doomed:
                self._drop(key)
            self._zones.pop((tenant, f"{channel}:{person}"), None)
            return sorted(schedule_id for _, schedule_id in doomed)

        # Rewritten whole: their lines must not stay behind in the log.
        return await self._change(work, rewrite=True)

    async def zone(self, tenant: str, person: str) -> str | None:
        return await self._read(lambda: self._zones.get((tenant, person)))

    async def set_zone(self, tenant: str, person: str, zone: str | None) -> None:
        def work() -> None:
            if zone is None:
                self._zones.pop((tenant, person), None)
            else:
                self._zones[(tenant, person)] = zone

        await self._change(work, rewrite=True)  # zones are few: written with a compaction

    async def claim(self, now: float, plan: Plan, limit: int) -> int:
        def work() -> int:
            due = self._index.waiting_due(now, limit)
            for record in due:
                self._set(plan(record, now))
            return len(due)

        # Nothing due (the common case at every poll): nothing written.
        first = (await self._read(lambda: self._index.earliest()))[0]
        if first is None or first > now:
            return 0
        return await self._change(work)

    async def deliver(self, now: float, deliver: Deliver, limit: int) -> int:
        first = (await self._read(lambda: self._index.earliest()))[1]
        if first is None or first > now:
            return 0
        claimed = await self._read(lambda: self._index.claimed_due(now, limit))
        if not claimed:
            return 0
        done = [await deliver(record) for record in claimed]

        def work() -> None:
            for before, after in zip(claimed, done, strict=True):
                current = self._records.get((before.tenant, before.id))
                if current is None or current.firing != before.firing:
                    continue  # erased meanwhile (the delivery is owed all the same)
                merged = dataclasses.replace(
                    after, state=current.state if current.state == "cancelled" else after.state,
                    next_at=current.next_at if current.state == "cancelled" else after.next_at)
                self._set(merged.settled())

        await self._change(work)
        return len(claimed)

    async def next_due(self) -> float | None:
        times = [t for t in await self._read(lambda: self._index.earliest()) if t is not None]
        return min(times) if times else None

    async def aclose(self) -> None:
        """Wait for file work a cancelled caller left running (idempotent)."""
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    def snapshot(self) -> dict[str, Any]:
        """Counts for ``/healthz`` (what was last read; no I/O)."""
        return {"schedules": sum(r.active for r in self._records.values())}
