"""The answered platform ids the owed journal remembers, in a fixed number of bytes.

The duplicate check of one gateway process (:mod:`coordination.journal`) remembers each
answered message's platform key for a day, so a platform's redelivery is recognised and
answered by what the first delivery got. Kept as strings, a key and its item cost ~430 bytes
a message: a busy process (10 messages a second) held ~380 MB after a day. Here each entry is
a 16-byte BLAKE2b digest of the key (tenant, conversation and platform id: a collision between
two live keys is a 2^-64 birthday event, so no new message is taken for a redelivery) and one
short packed record (when it arrived, the item id, the session's number in a shared table), in
arrival order. :data:`ENTRY_BYTES` is what one weighs, measured (``tests/coordination/
test_seen_keys.py`` checks it with ``tracemalloc``), and a session named by entries weighs
:data:`SESSION_BYTES` plus its name.

**At the cap** (``max_bytes``, ``GATEWAY_DEDUP_MEMORY``): the oldest entries are forgotten
first, before their day is over. Nothing else recognises a redelivery in one process (the
session logs are not searched for platform ids), so a platform's redelivery of a message older
than the oldest entry kept would be received as new and answered a second time. That is never
silent: every entry forgotten early is counted (:attr:`SeenKeys.evicted_early`), the span the
memory still covers is :attr:`SeenKeys.reach` (``/healthz``: ``dedup``), and the journal logs
a warning naming it. Telegram redelivers an update only while the gateway has not confirmed it
(it is confirmed once recorded), Slack retries within the hour; a reach of hours covers what
platforms do in practice, the day is the margin.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

DIGEST_SIZE = 16
ENTRY_BYTES = 200
"""Bytes one remembered key costs, at most: measured with ``tracemalloc`` on CPython 3.12,
141 (the digest, its record, their slots in the index and the order) to 171 just after the
index doubled."""
SESSION_BYTES = 320
"""Bytes a session named by remembered keys costs beyond its name (two table slots, a list,
an int)."""
_RECORD = struct.Struct("<dI")  # arrival time, session number (0: none); then the item id


def digest(key: str) -> bytes:
    """The 16 bytes a platform key is remembered by."""
    return hashlib.blake2b(key.encode(), digest_size=DIGEST_SIZE).digest()


@dataclass(frozen=True, slots=True)
class Remembered:
    """One answered key, as :meth:`SeenKeys.get` and :meth:`SeenKeys.entries` give it."""

    digest: bytes
    item: str
    at: float
    session: str | None


class SeenKeys:
    """Answered keys by digest, oldest first, within ``max_bytes`` (see the module docstring).

    :meth:`add` forgets the oldest entries when the new one would not fit; :meth:`expire`
    forgets those past the ttl. ``approx_bytes`` is the memory held, by the figures above."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._index: dict[bytes, bytes] = {}  # digest -> packed record
        self._order: deque[bytes] = deque()  # digests, oldest first
        self._session_no: dict[str, int] = {}
        self._sessions: dict[int, list[str | int]] = {}  # number -> [name, entries naming it]
        self._next_session = 1
        self._bytes = 0
        self.evicted_early = 0
        """Entries forgotten at the cap before their ttl ran out."""
        self.last_evicted_at: float | None = None
        """Arrival time of the newest entry forgotten at the cap (what :attr:`reach` is from)."""

    def __len__(self) -> int:
        return len(self._index)

    @property
    def approx_bytes(self) -> int:
        return self._bytes

    def reach(self, now: float) -> float | None:
        """Seconds back the memory covers since the cap forgot an entry early: the age of the
        oldest entry kept (``None`` while the cap never has: only the ttl limits it)."""
        if self.last_evicted_at is None:
            return None
        if not self._order:
            return 0.0
        return max(0.0, now - self._unpack(self._index[self._order[0]])[0])

    def snapshot(self) -> tuple[list[tuple[bytes, bytes]], dict[int, str]]:
        """The entries as they are now, cheaply (for a rewrite to render in its thread with
        :func:`rendered`): the records are never changed in place, only replaced."""
        names = {number: str(held[0]) for number, held in self._sessions.items()}
        # The index's own order is the order's: both gain at the end and lose the same keys.
        return list(self._index.items()), names

    def get(self, key_digest: bytes) -> Remembered | None:
        record = self._index.get(key_digest)
        return None if record is None else self._remembered(key_digest, record)

    def add(self, key_digest: bytes, item: str, at: float, session: str | None, *,
            ttl: float, now: float) -> int:
        """Remember an answered key (arrival order: ``at`` no older than the last one added,
        or it is placed as the newest anyway). Returns how many entries were forgotten to
        make room before their ttl ran out."""
        if key_digest in self._index:
            self._drop(key_digest)
            self._order.remove(key_digest)  # rare: the same key answered twice
        number = 0
        if session is not None:
            number = self._session_no.get(session, 0)
            if number == 0:
                number = self._next_session
                self._next_session += 1
                self._session_no[session] = number
                self._sessions[number] = [session, 0]
                self._bytes += SESSION_BYTES + sys.getsizeof(session)
            held = self._sessions[number]
            held[1] = int(held[1]) + 1
        self._index[key_digest] = _RECORD.pack(at, number) + _item_bytes(item)
        self._order.append(key_digest)
        self._bytes += ENTRY_BYTES
        early = 0
        while self._bytes > self.max_bytes and len(self._order) > 1:
            oldest = self._order.popleft()
            old_at = self._unpack(self._index[oldest])[0]
            self._drop(oldest)
            if now - old_at < ttl:
                early += 1
                self.last_evicted_at = old_at
        self.evicted_early += early
        return early

    def expire(self, now: float, ttl: float) -> None:
        """Forget the entries past the ttl (oldest first: only those are looked at)."""
        while self._order:
            oldest = self._order[0]
            if now - self._unpack(self._index[oldest])[0] < ttl:
                break
            self._order.popleft()
            self._drop(oldest)

    def discard(self, key_digests: set[bytes]) -> None:
        """Forget these entries (erasure; O(entries))."""
        if not key_digests:
            return
        for key_digest in key_digests:
            if key_digest in self._index:
                self._drop(key_digest)
        self._order = deque(d for d in self._order if d in self._index)

    def entries(self) -> Iterator[Remembered]:
        """Every entry, oldest first."""
        for key_digest in self._order:
            yield self._remembered(key_digest, self._index[key_digest])

    def _drop(self, key_digest: bytes) -> None:
        record = self._index.pop(key_digest)
        self._bytes -= ENTRY_BYTES
        number = _RECORD.unpack_from(record)[1]
        if number:
            held = self._sessions[number]
            held[1] = int(held[1]) - 1
            if held[1] == 0:
                name = str(held[0])
                del self._sessions[number], self._session_no[name]
                self._bytes -= SESSION_BYTES + sys.getsizeof(name)

    def _unpack(self, record: bytes) -> tuple[float, int]:
        at, number = _RECORD.unpack_from(record)
        return float(at), int(number)

    def _remembered(self, key_digest: bytes, record: bytes) -> Remembered:
        at, number = self._unpack(record)
        session = str(self._sessions[number][0]) if number else None
        return Remembered(key_digest, _item_str(record[_RECORD.size:]), at, session)


def rendered(snapshot: tuple[list[tuple[bytes, bytes]], dict[int, str]]
             ) -> Iterator[Remembered]:
    """The entries of a :meth:`SeenKeys.snapshot`, oldest first."""
    entries, names = snapshot
    for key_digest, record in entries:
        at, number = _RECORD.unpack_from(record)
        yield Remembered(key_digest, _item_str(record[_RECORD.size:]), float(at),
                         names[number] if number else None)


def _item_bytes(item: str) -> bytes:
    # Item ids are 16 hex digits (gateway.edge.coordination.new_item_id): 8 bytes packed. Any
    # other id is kept as text behind a 0xff marker (a packed id is exactly 8 bytes).
    if len(item) == 16:
        try:
            packed = bytes.fromhex(item)
        except ValueError:
            packed = b""
        if packed.hex() == item:  # lowercase, no spaces: it reads back the same
            return packed
    return b"\xff" + item.encode()


def _item_str(data: bytes) -> str:
    if len(data) == 8:
        return data.hex()
    return data[1:].decode()
