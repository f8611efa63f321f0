"""One gateway process: queues in memory over the owed journal, no leases, nothing to elect.

A message is recorded the moment it arrives (``records_on_receipt``): first as owed in the
journal (:mod:`coordination.journal`, which is also the one duplicate check), then in its
session (except one with files still to fetch, :func:`gateway.edge.messages.deferred`: recorded as
its turn starts, the journal holding it and its files' references until then, and the
conversation's messages queued behind it, or behind a ``/new``, which are recorded as their own
turns start, so the session keeps the order they came in); then it is
queued in a per-conversation deque and served by the one task the claim starts; the claim
ends, with no await in between, when the deque is empty. An item leaves the journal when it
is answered (``done``). Items still owed when the process stopped (killed,
or shut down with a queue) come back on the next start through :meth:`adoptions`, marked
``resumed``, in the order they were queued (then any never queued, in arrival order).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Self

from coordination.journal import DEDUP_MEMORY, JOURNAL_FILE, FileJournal
from coordination.keys import decode_item, encode_item, key_of, member
from gateway.edge.coordination import Claim, Entered, QueueItem
from gateway.edge.episodes import Episode
from gateway.edge.errors import Failure, UnavailableError, kind_of
from gateway.edge.messages import ConversationKey, deferred
from gateway.edge.pairing import PairingState
from sessions.reserve import Reserve
from sessions.sync_lane import FileSyncer

log = logging.getLogger(__name__)


class LocalConversations:
    """See :class:`gateway.edge.coordination.ConversationQueue`."""

    records_on_receipt = True

    def __init__(self, journal: FileJournal | None = None) -> None:
        self.journal = journal if journal is not None else FileJournal(None)
        self._queues: dict[ConversationKey, deque[QueueItem]] = {}
        self._entering: dict[str, asyncio.Future[bool]] = {}  # dedup key -> kept?
        self._keys: dict[str, str] = {}  # item id -> its dedup key, while entering
        self._recorded: dict[str, asyncio.Future[str]] = {}
        self._answered: dict[str, asyncio.Future[str]] = {}
        self._orphans: list[ConversationKey] = []
        # Queued items per conversation that later messages wait behind to be recorded.
        self._ahead: dict[ConversationKey, set[str]] = {}
        self._unwritten = Episode(log, "writing the owed journal")

    async def open(self) -> None:
        """Load the journal; what it still owes is queued for :meth:`adoptions`."""
        await self.journal.open()
        for owed in self.journal.owed():
            item = decode_item(owed.item, resumed=True).item
            key = key_of(owed.conversation)
            queue = self._queues.get(key)
            if queue is None:
                self._queues[key] = queue = deque()
                self._orphans.append(key)
            queue.append(item)
            # Queued now, in this order: an item the last run owed but never queued (it died
            # first) must keep its place ahead of what this run queues after it.
            self.journal.kept(item.id)
            self._count_ahead(item, 1)
        if self._orphans:
            log.info("%d message(s) in %d conversation(s) are owed an answer from before the "
                     "last stop; answering them first", len(self.journal.owed()),
                     len(self._orphans))

    async def aclose(self) -> None:
        if not await self.journal.settle():
            log.warning("the owed journal could not note every answer sent before the stop; "
                        "those are sent again after the next start")
        self.journal.close()

    @property
    def queued(self) -> int:
        # The head of each queue is the item being served, not waiting.
        return sum(max(0, len(q) - 1) for q in self._queues.values())

    async def enter(self, item: QueueItem, dedup_key: str | None = None) -> Entered:
        if dedup_key is not None:
            while (entering := self._entering.get(dedup_key)) is not None:
                await asyncio.shield(entering)  # its twin is being received: wait for it
            seen = self.journal.seen(dedup_key)
            if seen is not None:
                self._recorded.pop(item.id, None)
                return Entered(duplicate=True, original=seen[0], session_id=seen[1])
            # Claimed before the first await: a twin arriving meanwhile waits for this one.
            self._entering[dedup_key] = asyncio.get_running_loop().create_future()
            self._keys[item.id] = dedup_key
        try:
            await self.journal.owe(item.id, member(item.inbound.key), dedup_key,
                                   encode_item(item, ""))
        except OSError as exc:
            self._settle_entering(item, False)
            self._unwritten.failed(kind_of(exc))
            raise UnavailableError("store", kind_of(exc)) from exc
        self._unwritten.ok()
        return Entered()

    def _settle_entering(self, item: QueueItem, kept: bool) -> None:
        key = self._keys.pop(item.id, None)
        future = self._entering.pop(key, None) if key is not None else None
        if future is not None and not future.done():
            future.set_result(kept)

    async def keep(self, item: QueueItem) -> Claim | None:
        self._settle_entering(item, True)
        self.journal.kept(item.id)  # a restart queues it in this order, not the owed order
        self._count_ahead(item, 1)
        key = item.inbound.key
        queue = self._queues.get(key)
        if queue is None:
            self._queues[key] = deque([item])
            return Claim(key)
        queue.append(item)
        return None

    async def withdraw(self, item: QueueItem) -> None:
        await self.journal.drop(item.id)
        self._settle_entering(item, False)
        self._recorded.pop(item.id, None)

    async def next(self, claim: Claim) -> QueueItem | None:
        queue = self._queues.get(claim.key)
        if not queue:
            self._queues.pop(claim.key, None)
            return None
        return queue[0]

    async def done(self, claim: Claim, item: QueueItem) -> None:
        queue = self._queues.get(claim.key)
        if queue and queue[0] is item:
            queue.popleft()
            self._count_ahead(item, -1)
        # The answer is out: the conversation's next message need not wait for the fsync
        # of this line (see FileJournal.paid).
        await self.journal.paid(item.id, item.session, wait=False)
        if self.journal.pending_bytes:
            self._unwritten.failed(Failure.BACKLOG)
        answered = self._answered.pop(item.id, None)
        if answered is not None and not answered.done():
            answered.set_result(item.session or "")

    def holding(self, claim: Claim) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    def check(self, claim: Claim) -> None:
        return None  # one process: nobody can take a conversation over

    async def confirm(self, claim: Claim) -> None:
        return None  # one process: nobody can take a conversation over

    async def release(self, claim: Claim) -> None:
        # Shutdown (or a worker that could not go on): what is left stays owed in the
        # journal and is served on the next start.
        self._queues.pop(claim.key, None)
        self._ahead.pop(claim.key, None)

    async def refence(self, claim: Claim, at_least: int) -> None:
        claim.token = at_least

    def serving(self, key: ConversationKey) -> bool:
        return True  # one process serves every conversation

    def wind_down(self) -> None:
        """Nothing waits here: a conversation's task ends with its queue."""

    def records_later(self, key: ConversationKey) -> bool:
        return bool(self._ahead.get(key))

    def _count_ahead(self, item: QueueItem, step: int) -> None:
        # A /new (what follows belongs to the new session) and a message with files still to
        # fetch (recorded as its turn starts): what comes after is recorded after them. By id:
        # a deferred item's files are taken in (no longer deferred) before it is done.
        key = item.inbound.key
        ahead = self._ahead.get(key)
        if step < 0:
            if ahead is not None:
                ahead.discard(item.id)
                if not ahead:
                    del self._ahead[key]
        elif item.kind == "new" or (item.kind == "message" and deferred(item.inbound)):
            self._ahead.setdefault(key, set()).add(item.id)

    async def recorded(self, item: QueueItem, session_id: str) -> None:
        item.session = session_id
        future = self._recorded.pop(item.id, None)
        if future is not None and not future.done():
            future.set_result(session_id)

    def on_recorded(self, item: QueueItem) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._recorded[item.id] = future
        return future

    async def settled(self, item_id: str, within: float) -> str | None:
        answered, session = self.journal.paid_session(item_id)
        if answered:
            return session
        if not self.journal.is_owed(item_id):
            return None
        future = self._answered.get(item_id)
        if future is None:
            future = self._answered[item_id] = asyncio.get_running_loop().create_future()
        done, _ = await asyncio.wait([future], timeout=within)
        return future.result() if done else None

    async def erase(self, tenant: str, sessions: Collection[str],
                    items: Collection[str], dry: bool = False) -> int:
        return await self.journal.erase(sessions, items, dry=dry)

    async def adoptions(self) -> AsyncIterator[Claim]:
        # The conversations the last run left owed, once; nothing is orphaned later.
        orphans, self._orphans = self._orphans, []
        for key in orphans:
            if key in self._queues:
                yield Claim(key)



class InProcessCoordinator:
    """The default :class:`~gateway.edge.coordination.Coordinator`: one gateway process.

    ``data_dir``: where the owed journal lives (``<data_dir>/state/delivery.jsonl``);
    ``None`` keeps it in memory (tests that need no restart). ``journal``: a given one.
    ``reserve``: room on the data directory's disk for the journal's last notes at a stop.
    ``syncer``: the thread the journal's fsyncs run in (shared with the session store).
    ``dedup_memory``: bytes the journal's duplicate check may hold (``GATEWAY_DEDUP_MEMORY``).
    """

    def __init__(self, data_dir: Path | None = None, *, fsync: str = "turn",
                 journal: FileJournal | None = None, reserve: Reserve | None = None,
                 syncer: FileSyncer | None = None, dedup_memory: int = DEDUP_MEMORY) -> None:
        if journal is None:
            path = data_dir / "state" / JOURNAL_FILE if data_dir is not None else None
            journal = FileJournal(path, fsync=fsync, reserve=reserve, syncer=syncer,
                                  max_seen_bytes=dedup_memory)
        self.conversations = LocalConversations(journal)

    async def __aenter__(self) -> Self:
        await self.conversations.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.conversations.aclose()

    def elector(self, name: str) -> None:
        return None

    def erasure_bus(self) -> None:
        return None  # one process: nobody else to reach

    def pairing_state(self) -> PairingState | None:
        return None

    def health(self) -> Mapping[str, Any]:
        journal = self.conversations.journal
        return {"mode": "single", "owed": len(journal.owed()), "dedup": journal.dedup_health()}
