"""Conversation registry: conversation key -> its current session, opened lazily.

A conversation's session is created on its first message or resumed (the newest session whose
header names the conversation). What stays open is bounded by memory (``max_bytes``,
``GATEWAY_OPEN_SESSIONS_MEMORY``: each conversation's :attr:`~gateway.agent.conversation.
Conversation.approx_bytes`, counted when it is opened and each time its use ends) and,
optionally, by count (``max_open``: a JSONL session holds a file descriptor):
least-recently-used idle conversations are closed (writer flushed, descriptor released) and
resumed from the log when they speak again, so an idle conversation costs neither a task nor
a descriptor, and a worker keeps as many as fit, whether a thousand short ones or a few long
ones. A
conversation in use (:meth:`ConversationRegistry.hold`: a delivery recording into it, a worker
serving it) is never closed, nor rotated for idleness, under its user.

Workers sharing a PostgreSQL store pass the conversation's lease token as ``fence``: the
session is then (re)opened under that token, and read *after* the open, since from that moment
no writer with an older token can append (see :mod:`sessions.postgres.store`). A conversation cached
under an older token is moved on to the new one without reading it when the log has not grown
since this worker last wrote it (nobody else held it in between) and it is still the
conversation's latest session (not rotated by ``/new`` or erased by ``/forget`` on another
worker); otherwise it is read again.

Under one token a cached copy is handed out as it is: a holder only learns that another worker
took the conversation over (Redis lost the leases, and both held it for a moment) when the
store refuses its next write. A log index read off the store is therefore used only on a copy
that is that log (:meth:`ConversationRegistry.read_log`): a copy behind it is dropped.

A session opened (read) under a new token is the only copy that may hold what a holder with an
older token wrote after the new holder took its first item and before it opened the session
(Redis lost the leases, and the old holder took the same row just after it): the new holder
looks that item up in the log as it was read (:meth:`ConversationRegistry.opened_log`), even
though the item was taken for the first time. A copy moved on to a new token without reading
it holds nothing such: nobody wrote since this worker did.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, cast

from gateway.agent.compaction import summary_message
from gateway.agent.conversation import Conversation
from gateway.agent.recorder import SessionRecorder
from gateway.agent.window import ConversationOrder
from gateway.edge.messages import ChannelContext, ConversationKey
from gateway.edge.metrics import Metrics
from gateway.edge.scopes import scope_of
from sessions.compaction import latest_summary
from sessions.errors import SessionNotFoundError
from sessions.messages import read_messages
from sessions.records import MessageDict
from sessions.store import SessionStore, SessionWriter

if TYPE_CHECKING:
    from gateway.edge.coordination import FencedStore, FencedWriter

log = logging.getLogger(__name__)

OPEN_BYTES = 256 * 1024 * 1024
"""What open conversations may weigh together, by default (``GATEWAY_OPEN_SESSIONS_MEMORY``):
a few thousand conversations of some tens of messages each (``docs/sizing.md``)."""


class ConversationRegistry:
    """Owns every open :class:`Conversation`; the router asks it for one per inbound message."""

    def __init__(
        self,
        store: SessionStore,
        metrics: Metrics,
        *,
        persist_timeout: float = 2.0,
        max_open: int | None = None,
        max_bytes: int = OPEN_BYTES,
        idle_rotate: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.persist_timeout = persist_timeout
        self.max_open = max_open
        self.max_bytes = max_bytes
        self._bytes = 0  # what the open conversations weighed when last counted
        self._sizes: dict[ConversationKey, int] = {}
        self.idle_rotate = idle_rotate
        self.clock = clock
        self._open: OrderedDict[ConversationKey, Conversation] = OrderedDict()
        self._locks: dict[ConversationKey, asyncio.Lock] = {}
        self._fences: dict[ConversationKey, int] = {}  # the token each fenced session holds
        self._opened: dict[ConversationKey, bytes] = {}  # read as opened under a new token
        self._held: dict[ConversationKey, int] = {}  # conversations in use, by how many users

    def hold(self, key: ConversationKey) -> None:
        """Mark the conversation in use until a matching :meth:`release`: it is not closed to
        make room, nor rotated for idleness, meanwhile. Holds nest (count)."""
        self._held[key] = self._held.get(key, 0) + 1

    def release(self, key: ConversationKey) -> None:
        """End one :meth:`hold` of the conversation (its weight is counted again: it may
        have grown while in use)."""
        if self._held[key] == 1:
            del self._held[key]
            self._weigh(key)
        else:
            self._held[key] -= 1

    @property
    def open_bytes(self) -> int:
        """What the open conversations weigh, about (as last counted)."""
        return self._bytes

    def _weigh(self, key: ConversationKey) -> None:
        """Count the conversation's weight again (or drop it, when it is no longer open)."""
        conv = self._open.get(key)
        now = conv.approx_bytes if conv is not None else 0
        self._bytes += now - self._sizes.pop(key, 0)
        if conv is not None:
            self._sizes[key] = now

    def in_use(self, key: ConversationKey) -> bool:
        return key in self._held

    @property
    def held(self) -> int:
        """How many conversations are in use now."""
        return len(self._held)

    def open_keys(self) -> list[ConversationKey]:
        """The open conversations, least recently used first: the order eviction takes them
        in (a public view of it, so tests check the bounds without reaching inside)."""
        return list(self._open)

    def __len__(self) -> int:
        return len(self._open)

    def opened_log(self, key: ConversationKey) -> bytes | None:
        """The log as it was read when the conversation was last opened under a new token,
        once (``None`` when it was not, or was asked for already): what the holder's first
        item is looked up in (see the module docstring)."""
        return self._opened.pop(key, None)

    def _untrack(self, key: ConversationKey) -> None:
        self._fences.pop(key, None)
        self._opened.pop(key, None)

    def peek(self, key: ConversationKey) -> Conversation | None:
        return self._open.get(key)

    async def get(self, key: ConversationKey, context: ChannelContext,
                  fence: int | None = None) -> Conversation:
        """The conversation's open state, creating or resuming its session as needed.

        ``fence``: the caller's lease token (shared store); see the module docstring.
        """
        if self._full(0, adding=False):
            # Open conversations grew while in use (weighed again as each use ended): the
            # least recently used idle ones are closed now, before anything is handed out, so
            # the bound holds for a worker whose chats are all open, not only when it opens one.
            await self._evict(0, adding=False)
        if (fence is not None and key in self._open and self._fences.get(key) != fence
                and not await self._refence(key, fence)):
            await self.forget(key)
        conv = self._open.get(key)
        if conv is not None:
            if self._stale(conv.last_active) and (fence is not None or not self.in_use(key)):
                return await self.rotate(key, context, fence=fence)
            self._open.move_to_end(key)
            return conv
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            conv = self._open.get(key)
            if conv is None:
                conv = await self._load(key, context, fence)
                # Room is made before the insert: from the insert until the caller holds the
                # conversation (and can mark it busy) nothing awaits, so a concurrent eviction
                # can never close a session that is being handed out.
                await self._evict(room=conv.approx_bytes)
                self._open[key] = conv
                self._weigh(key)
        self._locks.pop(key, None)
        return conv

    async def _refence(self, key: ConversationKey, fence: int) -> bool:
        """Keep the cached conversation under a new token if it is still the log: it is still
        the conversation's latest session, the session is moved on to ``fence`` and nobody
        appended since this worker did (same ``next_seq``, nothing pending, and no append of
        its refused as stale). False: read it again. Other workers may have held the
        conversation meanwhile: a ``/new`` there made a newer session, a ``/forget`` (erasure,
        from any conversation of the person) deleted this one, and the copy here must not be
        carried on."""
        conv = self._open[key]
        writer = conv.recorder.writer
        if writer.pending_bytes or cast("FencedWriter", writer).fenced_off:
            return False  # fenced off: refused entries were counted, so next_seq proves nothing
        try:
            next_seq = await self._fenced().refence(key.tenant, conv.session_id, fence,
                                                    latest_of=key.label())
        except SessionNotFoundError:  # erased
            return False
        if next_seq is None or next_seq != writer.state.next_seq:
            return False  # rotated (not the latest any more), or written by another worker
        cast("FencedWriter", writer).refenced(fence)
        self._fences[key] = fence
        return True

    async def read_log(self, key: ConversationKey, conv: Conversation) -> bytes | None:
        """The log of ``conv``'s session, read now (a resumed item is looked up in it), or
        ``None`` when the copy is no longer that log, and then the copy is dropped: the log
        holds messages the copy lacks, the copy's writer had an append refused as stale (see
        :meth:`_refence`), or the session was erased. Another worker wrote the session under a
        newer token since this one read it (or erased it), so an index found in the log is
        past the copy's end or another message's there. The caller opens the conversation
        again under its token, which the store refuses once a newer token wrote."""
        try:
            data: bytes | None = await self.store.read_log(key.tenant, conv.session_id)
        except SessionNotFoundError:  # erased (a /forget served elsewhere)
            data = None
        if data is not None and not self._behind(key, conv, data):
            return data
        if self._open.get(key) is conv:
            await self.forget(key)
        return None

    def _behind(self, key: ConversationKey, conv: Conversation, data: bytes) -> bool:
        # Memory never runs ahead of the log but by what is pending, and never behind it: the
        # log holding more messages means another writer appended.
        if key in self._fences and cast("FencedWriter", conv.recorder.writer).fenced_off:
            return True
        return len(read_messages(data).messages) > len(conv.messages)

    async def rotate(self, key: ConversationKey, context: ChannelContext,
                     fence: int | None = None) -> Conversation:
        """Start a fresh session for the conversation (``/new``, idle rotation)."""
        old = self._open.pop(key, None)
        self._untrack(key)
        self._weigh(key)
        if old is not None:
            await _close(old.recorder.writer)
        writer = await self._create(key, context, fence)
        conv = self._wrap(key, writer, context, [])
        self._open[key] = conv
        self._weigh(key)
        if fence is not None:
            self._fences[key] = fence
        return conv

    async def forget(self, key: ConversationKey, fence: int | None = None) -> None:
        """Close the conversation's session and drop it from memory (a lease ended).

        With ``fence``, only if it is still the one opened under that token (a newer lease on
        this worker may have reopened it already).
        """
        if fence is not None and self._fences.get(key) != fence:
            return
        conv = self._open.pop(key, None)
        self._untrack(key)
        self._weigh(key)
        if conv is not None:
            await _close(conv.recorder.writer)

    async def close_where(self, predicate: Callable[[Conversation], bool]) -> int:
        """Close and drop every open conversation ``predicate`` picks (before an erasure);
        returns how many. One that speaks again is loaded from the store anew."""
        keys = [key for key, conv in self._open.items() if predicate(conv)]
        for key in keys:
            await self.forget(key)
        return len(keys)

    async def _load(self, key: ConversationKey, context: ChannelContext,
                    fence: int | None = None) -> Conversation:
        label = key.label()
        existing = await self.store.latest_session(key.tenant, label)
        if existing is not None:
            # Open (and fence) first, then read: no stale writer can append after the open,
            # and a torn tail is already repaired when the messages are read.
            writer = (await self._fenced().open(key.tenant, existing, fence=fence)
                      if fence is not None else await self.store.open(key.tenant, existing))
            data = await self.store.read_log(key.tenant, existing)
            logged = read_messages(data)
            if not self._stale(_epoch(logged.last_ts)):
                if fence is not None:
                    self._fences[key] = fence
                    self._opened[key] = data
                conv = self._wrap(key, writer, context, logged.messages)
                conv.order = ConversationOrder()
                for index in logged.order:  # messages whose turn never began join at begin()
                    conv.order.append(index, conv.costs[index])
                if (summary := latest_summary(data)) is not None:  # compaction goes on
                    conv.restore_summary(summary.call, summary_message(summary.text),
                                         summary.replaces)
                conv.last_active = _epoch(logged.last_ts) or self.clock()
                return conv
            await _close(writer)  # silent too long: the conversation starts a new session
        conv = self._wrap(key, await self._create(key, context, fence), context, [])
        if fence is not None:
            self._fences[key] = fence
        return conv

    def _stale(self, last_active: float | None) -> bool:
        """True when idle rotation is on and the conversation has been silent too long."""
        return bool(self.idle_rotate) and last_active is not None and (
            self.clock() - last_active > self.idle_rotate
        )

    async def _create(self, key: ConversationKey, context: ChannelContext,
                      fence: int | None = None) -> SessionWriter:
        # The header names whose memory scope the conversation has: erasure finds a person's
        # one-to-one sessions by it (gateway.erasure.eraser).
        extra = {"scope": scope_of(context).header()}
        if fence is not None:
            return await self._fenced().create(
                tenant=key.tenant, channel=key.channel, conversation=key.label(), fence=fence,
                extra=extra,
            )
        return await self.store.create(
            tenant=key.tenant, channel=key.channel, conversation=key.label(), extra=extra
        )

    def _fenced(self) -> FencedStore:
        # Checked at composition: a fence is only ever passed with a store that takes it.
        return cast("FencedStore", self.store)

    def _wrap(self, key: ConversationKey, writer: SessionWriter, context: ChannelContext,
              messages: list[MessageDict]) -> Conversation:
        recorder = SessionRecorder(writer, self.metrics, self.persist_timeout)
        conv = Conversation(key, recorder, context, messages)
        conv.clock = self.clock
        conv.last_active = self.clock()
        return conv

    def _full(self, room: int, *, adding: bool = True) -> bool:
        """Whether one more conversation of ``room`` bytes would not fit (``adding=False``:
        whether the open ones are past the bounds already)."""
        count = len(self._open) + (1 if adding else 0)
        return ((self.max_open is not None and count > self.max_open)
                or self._bytes + room > self.max_bytes)

    async def _evict(self, room: int = 0, *, adding: bool = True) -> None:
        """Close least-recently-used idle conversations until one more of ``room`` bytes
        fits (``adding=False``: until the open ones are within the bounds), or none is left
        to close."""
        if not self._full(room, adding=adding):
            return
        for key in list(self._open):
            if not self._full(room, adding=adding):
                break
            if self.in_use(key) or key not in self._open:  # (a concurrent eviction took it)
                continue
            if self._open[key].recorder.writer.pending_bytes:
                # The disk failed its last writes: closed now, they could only be dropped (or
                # use up the room kept for the stop); open, its next append or the stop writes
                # them. (Only while the disk fails can more than the bound stay open.)
                continue
            conv = self._open.pop(key)
            self._untrack(key)
            self._weigh(key)
            await _close(conv.recorder.writer)

    async def aclose(self) -> None:
        """Flush and close every open session (idempotent)."""
        self._fences.clear()
        self._opened.clear()
        self._sizes.clear()
        self._bytes = 0
        while self._open:
            _, conv = self._open.popitem(last=False)
            await _close(conv.recorder.writer)


async def _close(writer: SessionWriter) -> None:
    try:
        await writer.aclose()
    except Exception as exc:  # closing must go on for the other sessions
        log.warning("session %s: close failed (%s)", writer.session_id, type(exc).__name__)


def _epoch(ts: str | None) -> float | None:
    if ts is None:
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
