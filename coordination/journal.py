"""The owed journal of one gateway process: what was acknowledged and is not answered yet.

``<data_dir>/state/delivery.jsonl`` (0600 in a 0700 directory), one JSON array per line::

    ["owe", id, conversation, key, at, item]   received (durable before it is acknowledged)
    ["drop", id]                               withdrawn: not acknowledged after all
    ["paid", id, session, at]                  answered (its reply went out)
    ["seen#", digest, id, session, at]         (compaction) an answered item's platform key,
                                               as the hex of its digest (``seen`` with the key
                                               itself: earlier versions' files, still read)

It is the gateway's one duplicate check too (``key`` is the platform id, scoped to its
conversation): a key is remembered ``ttl`` seconds after its message arrived, so a platform's
redelivery within that time is recognised, across restarts, and answered by what the first
delivery got. In memory an answered key is a 16-byte digest and a short record
(:mod:`coordination.seen_keys`), held within ``GATEWAY_DEDUP_MEMORY`` bytes: past that the
oldest are forgotten before their ttl, counted and logged (what that means for a redelivery
is said there). On start, the owed items come back in arrival order and are served first
(:class:`coordination.local.LocalConversations`); only this small file is read, never the
session logs (they are opened per owed conversation).

Writes are appends of whole lines. An ``owe`` that cannot be written raises (the message is
then not acknowledged); a ``paid`` or ``drop`` that cannot be written is kept and written ahead
of the next line; the file is rewritten from what is live once it has grown. How (the fsyncs
shared between conversations, the rewrite in a thread) is :mod:`coordination.journal_disk`, a
base of :class:`FileJournal`; the lines' encoding and reading are
:mod:`coordination.journal_lines`.

One gateway process per data directory: the file is ``flock``-ed while open.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from pathlib import Path

import orjson

from coordination.journal_disk import JournalDisk, close_after
from coordination.journal_lines import OwedItem, Snapshot, encode, names, parsed
from coordination.seen_keys import SeenKeys, digest
from gateway.edge.errors import ConfigError
from sessions.files import FILE_MODE, ensure_private_dir
from sessions.reserve import Reserve
from sessions.sync_lane import FileSyncer, SyncLane

JOURNAL_FILE = "delivery.jsonl"
DEDUP_TTL = 25 * 3600.0
"""Seconds a platform id is remembered: Telegram keeps an unconfirmed update for 24 hours,
Slack retries within the hour and resends after reconnects."""
DEDUP_MEMORY = 64 * 1024 * 1024
"""Bytes the remembered keys may hold by default (``GATEWAY_DEDUP_MEMORY``): ~335,000 answered
messages, 25 hours of 3.7 messages a second."""
RECALLED = 4096
"""Answered items whose session a duplicate's look-up may still ask for (:meth:`FileJournal.
paid_session`), the most recent ones."""
CAP_WARNING_EVERY = 3600.0
"""Seconds between warnings that the cap shortens the duplicate check's memory."""
COMPACT_SLACK = 1000
"""Lines the file may hold beyond twice the live ones before it is rewritten."""


log = logging.getLogger(__name__)


class FileJournal(JournalDisk):
    """See the module docstring. ``path=None`` keeps everything in memory (tests)."""

    def __init__(self, path: Path | None, *, ttl: float = DEDUP_TTL, fsync: str = "turn",
                 clock: Callable[[], float] = time.time,
                 sync_file: Callable[[int], None] = os.fsync,
                 write_file: Callable[[int, memoryview], int] = os.write,
                 truncate_file: Callable[[int, int], None] = os.ftruncate,
                 reserve: Reserve | None = None, syncer: FileSyncer | None = None,
                 sync_rewrite: Callable[[int], None] = os.fsync,
                 max_seen_bytes: int = DEDUP_MEMORY) -> None:
        """``sync_file``, ``write_file`` and ``truncate_file`` are the disk's fsync, append and
        cut-back after a failed append (the seams tests use to count, hold or fail them);
        ``sync_rewrite`` the fsync of a rewrite's new file (in the rewrite's thread).
        ``reserve``: room :meth:`settle` frees when the disk is full at the stop, so the notes
        of answers sent are written (:mod:`sessions.reserve`); held from :meth:`open` on.
        ``syncer``: the thread the fsyncs run in (:mod:`sessions.sync_lane`; the gateway shares
        one with its session store, so a turn's two fsyncs share rounds with other turns');
        by default one of the journal's own, over ``sync_file``. ``max_seen_bytes``: what the
        remembered keys may weigh (:mod:`coordination.seen_keys`)."""
        self.path = path
        self.ttl = ttl
        self.fsync = fsync
        self.clock = clock
        self._syncer: FileSyncer = syncer or SyncLane(sync_file, "fsync:journal")
        self._sync_rewrite = sync_rewrite
        self._write_file = write_file
        self._truncate_file = truncate_file
        self._reserve = reserve
        self._owed: dict[str, OwedItem] = {}
        # Owed items queued for their turn (``kept``), in the order they were queued: the order
        # their conversation serves them. It can differ from the order they were owed in
        # (recording a message awaits its session, and concurrent deliveries resume from that
        # in any order), and a restart must serve them as the live queue would have.
        self._kept: dict[str, None] = {}
        self._owed_keys: dict[str, str] = {}  # key -> id of an owed item
        self._seen = SeenKeys(max_seen_bytes)  # answered keys, oldest first
        # id -> session of the latest answered items (a duplicate's look-up asks right after
        # finding its original); bounded, unlike the keys it is no promise.
        self._recalled: OrderedDict[str, str | None] = OrderedDict()
        self._warned_at: float | None = None
        self._fd: int | None = None
        self._size = 0  # bytes of whole lines in the file
        self._torn = False  # a torn tail is past _size and still to be cut
        self._lines = 0
        self._backlog = b""
        self._opened = False
        # Group commit: appends written so far, how many an fsync has covered, and the
        # fsync in flight (done when it ends, whatever it covered).
        self._writes = 0
        self._synced = 0
        self._syncing: asyncio.Future[None] | None = None
        # Fsyncs of paid lines nobody waits for (paid(wait=False)); settle() waits for them.
        self._background: set[asyncio.Future[None]] = set()
        # A rewrite in progress (see _compact): the lines appended to the old file since its
        # snapshot, and, while the new file's last fsync runs, what sync waiters wait for.
        self._compaction: asyncio.Task[None] | None = None
        self._tail: list[bytes] | None = None
        self._swapping: asyncio.Future[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Load the file (off the loop: it may hold a day of keys), compact it, lock it."""
        if self._opened:
            return
        if self.path is not None:
            await asyncio.to_thread(self._load)
        self._opened = True

    def _load(self) -> None:
        assert self.path is not None
        ensure_private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"another gateway process uses the data directory of {self.path}"
                              " (one process per GATEWAY_DATA_DIR)") from None
        os.fchmod(fd, FILE_MODE)
        self._fd = fd
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        whole = data.rfind(b"\n") + 1
        if whole != len(data):  # a torn last line: cut it before anything is appended
            os.ftruncate(fd, whole)
        self._size = whole
        lines = data[:whole].split(b"\n")
        for raw in lines:
            self._apply(raw)
        self._lines = len(lines) - 1
        self._expire(self.clock())
        with contextlib.suppress(OSError):  # a full or read-only disk: append to it as it is
            self._rewrite()
        if self._reserve is not None:
            self._reserve.ensure()

    def _apply(self, raw: bytes) -> None:
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return  # a torn last line, or an empty one
        if not isinstance(line, list) or not line:
            return
        try:
            kind = line[0]
            if kind == "owe":
                _, item_id, conversation, key, at, body = line
                self._note_owed(OwedItem(str(item_id), str(conversation),
                                         None if key is None else str(key), float(at), str(body)))
            elif kind == "drop":
                self._forget_owed(str(line[1]))
            elif kind == "kept":
                self._note_kept(str(line[1]))
            elif kind == "paid":
                _, item_id, session, _at = line
                self._note_paid(str(item_id), None if session is None else str(session))
            elif kind in ("seen", "seen#"):
                _, key, item_id, session, at = line
                self._remember(bytes.fromhex(key) if kind == "seen#" else digest(str(key)),
                               str(item_id), float(at),
                               None if session is None else str(session))
        except (ValueError, TypeError):
            return  # not a line we wrote: ignored like a torn one

    def close(self) -> None:
        """Release the file (idempotent). Call :meth:`settle` first (it also waits for a
        rewrite in progress; one still running here is abandoned, its new file removed)."""
        if self._compaction is not None:
            self._compaction.cancel()
        fd, self._fd = self._fd, None
        if fd is not None:
            close_after(fd, self._syncing)  # an fsync nobody waited for may be running

    # -- queries -------------------------------------------------------------------------------

    def owed(self) -> list[OwedItem]:
        """Every owed item in the order its conversation serves it: those queued for their
        turn in the order they were queued, then the others in arrival order (their turn
        never began: live, they would have joined the queue after the queued ones)."""
        kept = [self._owed[i] for i in self._kept]
        return kept + [o for i, o in self._owed.items() if i not in self._kept]

    def seen(self, key: str) -> tuple[str, str | None] | None:
        """``(item id, session or None)`` of the live delivery with this key, if any."""
        owed = self._owed_keys.get(key)
        if owed is not None:
            return owed, None
        seen = self._seen.get(digest(key))
        if seen is None:
            return None
        if self.clock() - seen.at >= self.ttl:
            return None
        self._recall(seen.item, seen.session)
        return seen.item, seen.session

    def is_owed(self, item_id: str) -> bool:
        return item_id in self._owed

    def paid_session(self, item_id: str) -> tuple[bool, str | None]:
        """``(answered, session)`` of an item answered lately, or whose key :meth:`seen` just
        found (``(False, None)`` for any other)."""
        if item_id in self._recalled:
            return True, self._recalled[item_id]
        return False, None

    def dedup_health(self) -> dict[str, float | int | None]:
        """The duplicate check's memory, for ``/healthz``: keys, bytes, the cap, entries the cap
        forgot before their ttl, and the seconds back it still covers then (``None``: the
        full ttl)."""
        seen = self._seen
        return {"keys": len(seen), "bytes": seen.approx_bytes, "max_bytes": seen.max_bytes,
                "evicted_early": seen.evicted_early, "reach_seconds": seen.reach(self.clock())}

    @property
    def seen_keys(self) -> SeenKeys:
        """The remembered answered keys (tests and health read their size)."""
        return self._seen

    def __len__(self) -> int:
        """Live records (lines a rewrite keeps): owed items, their queued marks, remembered
        keys."""
        return len(self._owed) + len(self._kept) + len(self._seen)

    # -- writes --------------------------------------------------------------------------------

    async def owe(self, item_id: str, conversation: str, key: str | None, item: str) -> None:
        """Record an item as owed; raises ``OSError`` (and records nothing) if it cannot."""
        owed = OwedItem(item_id, conversation, key, self.clock(), item)
        self._write(encode(["owe", owed.id, owed.conversation, owed.key, owed.at, owed.item]),
                    keep=False)
        self._note_owed(owed)
        if self.fsync == "always":
            await self._sync()

    def kept(self, item_id: str) -> None:
        """The owed item was queued for its turn (never raises; a failed write is retried).
        Not synced: losing the line (an OS crash) only loses this ordering hint."""
        if item_id in self._owed and item_id not in self._kept:
            self._note_kept(item_id)
            self._write_kept(encode(["kept", item_id]))

    async def drop(self, item_id: str) -> None:
        """The item was not acknowledged after all: forget it (never raises)."""
        if self._forget_owed(item_id) is not None:
            self._write_kept(encode(["drop", item_id]))

    async def paid(self, item_id: str, session: str | None, *, wait: bool = True) -> None:
        """The item was answered: no longer owed (never raises; a failed write is retried).

        Returns once the line is durable; with ``wait=False`` once it is written, its fsync
        (shared, as any) running on in the background, :meth:`settle` waiting for it. The
        conversation's next message need not wait for it: the fsync begins at the same
        moment either way, so a crash finds the same lines on disk, and a restart that finds
        the item still owed finishes it by the messages noted or found for it."""
        if item_id not in self._owed:
            return
        self._note_paid(item_id, session)
        self._write_kept(encode(["paid", item_id, session, self.clock()]))
        if self.fsync != "none" and not self._backlog:
            if wait or self.fsync == "always":
                await self._sync()
            else:
                syncing = asyncio.ensure_future(self._sync())
                self._background.add(syncing)
                syncing.add_done_callback(self._background.discard)

    def _write_kept(self, line: bytes) -> None:
        with contextlib.suppress(OSError):  # kept: written ahead of the next line or by flush()
            self._write(line, keep=True)
        self._maybe_compact()

    async def erase(self, sessions: Collection[str], items: Collection[str], *,
                    dry: bool = False) -> int:
        """Forget an erased person's answered items (those answered in one of ``sessions``, and
        ``items``) and rewrite the file without their lines, at once: their text (an ``owe``
        line stays in the file after its answer until a rewrite) and their platform ids go.
        Items still owed stay: their messages are still to be answered. Returns how many lines
        of the file were theirs (``dry``: counts them, changes nothing). Raises ``OSError``
        when the file cannot be rewritten."""
        while self._compaction is not None:  # a rewrite in progress holds the old lines
            await asyncio.shield(self._compaction)
        sessions, wanted = set(sessions), set(items)
        data = os.pread(self._fd, self._size, 0) if self._fd is not None else b""
        lines = parsed(data)
        wanted.update(str(line[1]) for line in lines
                      if line[0] == "paid" and len(line) == 4 and line[2] in sessions)
        wanted.update(i for i, session in self._recalled.items() if session in sessions)
        remembered = list(self._seen.entries())
        wanted.update(s.item for s in remembered if s.session in sessions)
        wanted.difference_update(self._owed)
        count = sum(names(line, wanted, sessions) for line in lines)
        if dry:
            return count
        self._seen.discard({s.digest for s in remembered if s.item in wanted})
        for item_id in wanted:
            self._recalled.pop(item_id, None)
        if self.path is None or self._fd is None:
            return count
        old = self._swap_in_snapshot()
        self._backlog = b""  # what it held is in memory, so in the new file
        close_after(old, self._syncing)  # an fsync of the old file may be running
        return count

    # -- memory --------------------------------------------------------------------------------

    def _note_owed(self, owed: OwedItem) -> None:
        self._owed[owed.id] = owed
        if owed.key is not None:
            self._owed_keys[owed.key] = owed.id

    def _note_kept(self, item_id: str) -> None:
        if item_id in self._owed:
            self._kept[item_id] = None

    def _forget_owed(self, item_id: str) -> OwedItem | None:
        self._kept.pop(item_id, None)
        owed = self._owed.pop(item_id, None)
        if owed is not None and owed.key is not None:
            self._owed_keys.pop(owed.key, None)
        return owed

    def _note_paid(self, item_id: str, session: str | None) -> None:
        owed = self._forget_owed(item_id)
        if owed is not None and owed.key is not None:
            self._remember(digest(owed.key), item_id, owed.at, session)
            self._recall(item_id, session)

    def _remember(self, key_digest: bytes, item_id: str, at: float,
                  session: str | None) -> None:
        now = self.clock()
        if self._seen.add(key_digest, item_id, at, session, ttl=self.ttl, now=now) and (
                self._warned_at is None or now - self._warned_at >= CAP_WARNING_EVERY):
            self._warned_at = now
            reach = self._seen.reach(now) or 0.0
            log.warning("the duplicate check is at its memory cap (%d bytes, %d platform ids):"
                        " it now remembers %.1f h of answered messages, not %.0f h; a "
                        "platform's redelivery of an older message would be answered again "
                        "(raise GATEWAY_DEDUP_MEMORY)", self._seen.max_bytes, len(self._seen),
                        reach / 3600, self.ttl / 3600)

    def _recall(self, item_id: str, session: str | None) -> None:
        self._recalled[item_id] = session
        self._recalled.move_to_end(item_id)
        while len(self._recalled) > RECALLED:
            self._recalled.popitem(last=False)

    def _expire(self, now: float) -> None:
        """Forget answered keys older than the ttl (oldest first; owed ones never expire)."""
        self._seen.expire(now, self.ttl)

    def _maybe_compact(self) -> None:
        # Keys expire as time goes (amortised O(1): only the oldest are looked at), so the
        # live count falls behind the lines written and the file gets rewritten.
        self._expire(self.clock())
        if (self._lines <= 2 * len(self) + COMPACT_SLACK or self._backlog
                or self._compaction is not None):
            return
        if self.path is None or self._fd is None:
            self._lines = len(self)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to keep running (a test calling it bare): inline
            with contextlib.suppress(OSError):
                self._rewrite()
            return
        self._tail = []
        self._compaction = loop.create_task(self._compact(self._snapshot()))

    def _snapshot(self) -> Snapshot:
        """The live records as they are now (references: the records are never changed in
        place, only replaced), for a rewrite to render in its thread."""
        return list(self._owed.values()), list(self._kept), self._seen.snapshot()
