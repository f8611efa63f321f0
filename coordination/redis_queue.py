"""Conversations shared by workers: the queue in PostgreSQL, the lease in Redis.

What is owed lives with the sessions (:class:`gateway.edge.coordination.SharedInbox`, the
``inbox`` table): a receiver records a message there, and only then is it acknowledged (its
platform id is refused there as a duplicate in the same statement). Redis only says who serves
a conversation now: its lease (``SET NX PX``), renewed every ``ttl/3`` while held. Its value is
the claim's *mark* (the worker's id and a number of its own), and only that claim extends or
deletes it: a worker that lost a lease (Redis lost it) may claim the conversation again while
its old holder winds up, and the old holder's release must not drop the new one's lease. A
receiver that gets the lease serves the conversation; otherwise the holder reaches the message
in order. Losing Redis (restart, FLUSHDB, failover) loses no message: the leases go, turns in
flight are stopped by their guards, and the sweep hands every conversation with unanswered
rows to a worker again.

The holder takes the head row (:meth:`SharedInbox.head`), records it in the session as its
turn starts, and marks it answered (:meth:`RedisConversations.done`) the moment its reply is
out. When the queue is empty it gives the lease up and looks once more: a message entered
meanwhile is either seen then or finds the lease free, so nothing is stranded. Its fencing
token comes from PostgreSQL's sequence (drawn with the first row it takes,
:meth:`SharedInbox.head`, or :meth:`SharedInbox.next_fence`), never from Redis, so a token
cannot repeat or go back and a worker whose lease passed on cannot write to the session any
more (``StaleWriterError``). While it serves, :class:`~coordination.lease_guard.LeaseGuard`
stops the turn as soon as the lease may have lapsed. The database being away makes the holder
wait (with a backoff) while it keeps its lease; Redis being away makes new messages wait in
the inbox (``503 coordination unavailable`` to the sender, who retries into a duplicate).

Every worker sweeps every ``ttl/3`` or so: conversations with unanswered rows and no lease
are adopted. A head row taken before (``attempts > 1``) comes back marked ``resumed``.

**A lease kept a moment** (``linger``, ``GATEWAY_LEASE_LINGER``). People send one message at
a time, so a queue is empty after almost every answer. Rather than give the lease up at once
(and take a new lease and a new fencing token, and have the session moved on to it, for the
next message a few seconds later), the holder keeps it, renewed, for ``linger`` seconds,
waiting for the conversation's next message: one received by this worker wakes it directly
(:meth:`keep`); one received by another worker finds the lease taken, and its receiver tells
the holder's worker through its relay list (a *poke*: the lease's value names the worker).
The holder then serves it under the same lease and token, with the session as it left it, and
a reply to a request held elsewhere is relayed as before. The poke only saves time: a holder
whose wait ends gives the lease up and looks once more, as always, so a lost poke (Redis
flushed) delays a message by at most ``linger``, never strands it. Fencing is unchanged: the
lease is held, and renewed, the whole time (a holder that loses it is stopped by its guard
as during a turn), and a newer holder still takes a newer token, which refuses this one's
writes. The answer that ends a turn also takes the next item in the same statement
(:meth:`SharedInbox.answered_then_head`), so a queue is read once per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from functools import partial
from typing import TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from coordination import scripts
from coordination.keys import Keys, decode_item, encode_item, key_of, member
from coordination.lease_guard import LeaseGuard, guarded
from coordination.relay import Relay
from gateway.edge.coordination import (
    Claim,
    Entered,
    LeaseLostError,
    OwedHead,
    QueueItem,
    SharedInbox,
)
from gateway.edge.episodes import Episode
from gateway.edge.errors import UnavailableError, kind_of
from gateway.edge.messages import ConversationKey
from gateway.edge.tasks import bounded

log = logging.getLogger(__name__)

T = TypeVar("T")

LEASE_SAFETY = 0.8
"""A held lease is trusted for this fraction of its ttl after the last confirmed extension
(the margin covers clock drift and the time a reply from Redis takes)."""
KEEP_ANSWERED = 25 * 3600
"""Seconds an answered row is kept, so its platform id still counts as seen (Telegram keeps an
unconfirmed update a day)."""
STORE_RETRY = 0.2
MAX_STORE_RETRY = 5.0
SETTLED_POLL = 0.2


class RedisConversations:
    """See the module docstring and :class:`gateway.edge.coordination.ConversationQueue`."""

    records_on_receipt = False

    def __init__(self, redis: aioredis.Redis, keys: Keys, worker: str, relay: Relay,
                 inbox: SharedInbox, *, lease_ttl: float, linger: float = 0.0) -> None:
        """``linger``: seconds a holder keeps its lease after its queue emptied, waiting for
        the conversation's next message (see the module docstring; 0: let go at once)."""
        self._redis = redis
        self.keys = keys
        self.worker = worker
        self.relay = relay
        self.inbox = inbox
        self.lease_ttl = lease_ttl
        self.linger = linger
        self._ttl_ms = max(1, int(lease_ttl * 1000))
        self._take_script = redis.register_script(scripts.TAKE)
        self._extend = redis.register_script(scripts.EXTEND)
        self._release = redis.register_script(scripts.RELEASE_LEASE)
        self._held: dict[ConversationKey, tuple[LeaseGuard, Claim]] = {}
        self._deferred: set[ConversationKey] = set()  # see keep()
        self._wakes: dict[ConversationKey, asyncio.Event] = {}  # a held queue may have grown
        self._ahead: dict[ConversationKey, QueueItem | None] = {}  # taken with an answer
        self._winding_down = False
        relay.on_poke = self._poked
        self._granted: dict[str, float] = {}  # lease mark -> loop time the lease was asked for
        self._marks = itertools.count(1)
        self._origins: dict[str, tuple[str, bool]] = {}  # item id -> (receiver, relayed)
        self._redis_down = Episode(log, "coordination: Redis")
        self._store_down = Episode(log, "coordination: the session database")
        self._pruned = 0.0

    @property
    def queued(self) -> int:
        """Messages this worker received whose turn has not started yet (relayed ones)."""
        return self.relay.waiting

    @property
    def held(self) -> int:
        return len(self._held)

    # -- receiving ---------------------------------------------------------------------------

    async def enter(self, item: QueueItem, dedup_key: str | None = None) -> Entered:
        key = item.inbound.key
        try:
            seen = await self.inbox.enter(key.tenant, member(key), item.id, dedup_key,
                                          encode_item(item, self.worker))
        except OSError as exc:
            self.relay.forget(item.id)
            self._store_down.failed(kind_of(exc))
            raise UnavailableError("store", kind_of(exc)) from exc
        except BaseException:
            self.relay.forget(item.id)
            raise
        self._store_down.ok()
        if seen is not None:
            self.relay.forget(item.id)
            return Entered(duplicate=True, original=seen.item, session_id=seen.session_id)
        return Entered()

    async def keep(self, item: QueueItem) -> Claim | None:
        key = item.inbound.key
        if key in self._held:
            # This worker serves the conversation already; its holder reaches the item in
            # order (next() looks again before it lets go). Taking the lease here too would,
            # once Redis lost it (FLUSHDB, a restart), start a second holder in this process:
            # both would share one cached session, so the fence could not tell them apart,
            # and both would record and answer the same messages (the redis-flush trial).
            self._deferred.add(key)
            self._wake(key)
            return None
        try:
            mark = await self._take(key, poke=True)
        except (RedisError, OSError, TimeoutError) as exc:
            # Recorded already: the sweep serves it once Redis is back. The sender is told
            # so (503), and its retry is a duplicate answered from the record.
            self.relay.forget(item.id)
            self._redis_down.failed(type(exc).__name__)
            raise UnavailableError("coordination", type(exc).__name__) from exc
        self._redis_down.ok()
        return Claim(key, lease=mark) if mark is not None else None

    async def withdraw(self, item: QueueItem) -> None:
        """Stop waiting for the item's reply here; its inbox row stays owed. With several
        workers nothing is recorded on receipt (``records_on_receipt`` is False), so nothing
        after :meth:`enter` can fail to receive it: the row is answered by whoever serves the
        conversation, and the platform's redelivery of it is a duplicate answered from it.
        Deleting the row instead would only make that redelivery a second message."""
        self.relay.forget(item.id)

    def on_recorded(self, item: QueueItem) -> asyncio.Future[str] | None:
        if item.sink is None:
            return None
        return self.relay.expect(item.id, item.sink)

    def records_later(self, key: ConversationKey) -> bool:
        return False  # every message is recorded as its turn starts

    # -- serving -----------------------------------------------------------------------------

    @asynccontextmanager
    async def holding(self, claim: Claim) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        granted = (self._granted.pop(claim.lease, loop.time()) if claim.lease is not None
                   else loop.time())
        guard = LeaseGuard(task, granted + self.lease_ttl * LEASE_SAFETY, claim.key.label())
        held = (guard, claim)
        self._held[claim.key] = held
        self._wakes[claim.key] = asyncio.Event()
        try:
            async with guarded(guard):
                # The claim's token is drawn with its first item (next()): one round trip.
                yield
        finally:
            if self._held.get(claim.key) is held:
                del self._held[claim.key]
                self._wakes.pop(claim.key, None)
                ahead = self._ahead.pop(claim.key, None)  # taken, not served: the next
                if ahead is not None:  # holder gets it as resumed
                    self._origins.pop(ahead.id, None)
                self._deferred.discard(claim.key)  # left owed: the sweep hands it on

    def check(self, claim: Claim) -> None:
        held = self._held.get(claim.key)
        if held is not None:
            held[0].check()

    async def next(self, claim: Claim) -> QueueItem | None:
        key = claim.key
        conversation = member(key)
        while True:
            if key in self._ahead:  # looked at with the last answer (done())
                item = self._ahead.pop(key)
            else:
                self._looking(key)
                head = await self._store(partial(self.inbox.head, fenced=claim.token is None),
                                         key.tenant, conversation)
                if head is not None and head.fence is not None:
                    claim.token = head.fence  # drawn after the lease was taken: newer than
                item = self._item(head)  # any earlier holder's
            if item is not None:
                return item
            if await self._lingered(key):
                continue  # woken: a message for it came meanwhile (or may have)
            # Empty: give the lease up, then look again. A message entered meanwhile is seen
            # now, or its receiver found the lease free and serves it, or (a receiver in this
            # worker, which left it to us) it is named in _deferred.
            self._deferred.discard(key)
            await self._give_up(claim)
            if (not await self._store(self.inbox.has_owed, key.tenant, conversation)
                    and key not in self._deferred):
                return None
            mark = await self._take(key)
            if mark is None:
                return None
            claim.lease = mark
            granted = self._granted.pop(mark)
            held = self._held.get(key)
            if held is not None:
                held[0].extend(granted + self.lease_ttl * LEASE_SAFETY)
            # Someone may have held it in between: a new lease, a new token (drawn with the
            # item the next look finds).
            claim.token = None

    async def done(self, claim: Claim, item: QueueItem) -> None:
        if item.id not in self._origins:
            return  # marked already (at its reply; this is the end of its turn)
        key = claim.key
        if self._held.get(key, (None, None))[1] is claim:
            # The same statement takes the next item (one read of the queue per message).
            self._looking(key)
            head = await self._store(self.inbox.answered_then_head, item.id, item.session,
                                     key.tenant, member(key))
            self._ahead[key] = self._item(head)
        else:
            await self._store(self.inbox.answered, item.id, item.session)
        self._origins.pop(item.id, None)
        await self._prune()

    def serving(self, key: ConversationKey) -> bool:
        return key in self._held

    def wind_down(self) -> None:
        """The worker stops: holders keep no lease waiting for more (those waiting let go)."""
        self._winding_down = True
        for wake in self._wakes.values():
            wake.set()

    def _item(self, head: OwedHead | None) -> QueueItem | None:
        if head is None:
            return None
        wire = decode_item(head.body, resumed=head.attempts > 1)
        item = wire.item
        if wire.relay:
            item.sink = self.relay.sink(item.id, wire.origin)
        self._origins[item.id] = (wire.origin, wire.relay)
        return item

    def _looking(self, key: ConversationKey) -> None:
        """About to read the queue: a wake-up from now on is for what this read may miss."""
        wake = self._wakes.get(key)
        if wake is not None:
            wake.clear()

    def _wake(self, key: ConversationKey) -> None:
        wake = self._wakes.get(key)
        if wake is not None:
            wake.set()

    def _poked(self, conversation: str) -> None:
        """Another worker received a message for a conversation held here (the relay)."""
        with contextlib.suppress(ValueError, TypeError):
            self._wake(key_of(conversation))

    async def _lingered(self, key: ConversationKey) -> bool:
        """Keep the lease up to ``linger`` seconds for the next message; True if woken."""
        wake = self._wakes.get(key)
        if wake is None or self.linger <= 0 or self._winding_down:
            return False
        try:
            async with asyncio.timeout(self.linger):
                await wake.wait()
        except TimeoutError:
            return False
        return not self._winding_down

    async def release(self, claim: Claim) -> None:
        await self._give_up(claim)

    async def refence(self, claim: Claim, at_least: int) -> None:
        # The session holds a newer token than the claim: written before this deployment
        # shared its store (raise ours), or another worker holds the conversation now and
        # this lease has passed on without the guard knowing yet (Redis flushed, a takeover
        # the renewal has not seen). Raising the token then would fence the rightful holder
        # off and spend a provider call on a turn it also runs: ask Redis first.
        await self._confirm(claim)
        claim.token = await self._store(self.inbox.next_fence, at_least)

    async def confirm(self, claim: Claim) -> None:
        self.check(claim)
        await self._confirm(claim)

    async def _confirm(self, claim: Claim) -> None:
        """:class:`LeaseLostError` unless Redis says the claim holds its lease now."""
        key = claim.key
        try:
            async with bounded():
                owner = await self._redis.get(self.keys.lease(key))
        except (RedisError, OSError, TimeoutError) as exc:
            self._redis_down.failed(type(exc).__name__)
            raise LeaseLostError(f"lease on {key.label()} could not be confirmed") from exc
        if claim.lease is None or owner != claim.lease:
            raise LeaseLostError(f"lease on {key.label()} has passed on")

    async def recorded(self, item: QueueItem, session_id: str) -> None:
        origin, relayed = self._origins.get(item.id, ("", False))
        if relayed:
            await self.relay.recorded(item.id, origin, session_id)

    async def settled(self, item_id: str, within: float) -> str | None:
        """Polls the inbox: the answer may come from any worker."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            try:
                status = await self.inbox.status(item_id)
            except OSError:
                status = None  # the database is away: keep waiting until the deadline
            if status is not None and status[0]:
                return status[1]
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(min(SETTLED_POLL, max(0.0, deadline - loop.time())))

    async def erase(self, tenant: str, sessions: Collection[str],
                    items: Collection[str], dry: bool = False) -> int:
        return await self.inbox.erase(tenant, sessions, items, dry)

    async def adoptions(self) -> AsyncIterator[Claim]:
        interval = max(0.1, self.lease_ttl / 3)
        sweeping = Episode(log, "coordination: the sweep for owed conversations")
        while True:
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))  # workers spread out
            try:
                claims = await self.sweep()
            except Exception as exc:  # the next sweep tries again; never end the adoptions
                sweeping.failed(type(exc).__name__)
                continue
            sweeping.ok()
            for claim in claims:
                yield claim

    async def sweep(self) -> list[Claim]:
        """Take the lease of every conversation that has unanswered items and no holder."""
        owed = await self.inbox.owed_conversations()
        claims = []
        for _, conversation in owed:
            key = key_of(conversation)
            if key in self._held:
                continue
            mark = await self._take(key)
            if mark is not None:
                claims.append(Claim(key, lease=mark))
                log.info("coordination: took over %s", key.label())
        return claims

    async def renew_forever(self) -> None:
        """Extend every held lease each ``ttl/3``; a lease found taken is given up at once.
        Never raises (a failure ends no worker: the guards lapse on their own)."""
        loop = asyncio.get_running_loop()
        renewing = Episode(log, "coordination: lease renewal")
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                # (A claim with no mark gave its lease up in next() and asks for it again.)
                held = [(key, entry, entry[1].lease) for key, entry in self._held.items()
                        if entry[1].lease is not None]
                if not held:
                    continue
                asked = loop.time()
                async with bounded():
                    results = await scripts.run_many(self._redis, self._extend, [
                        ([self.keys.lease(key)], [mark, self._ttl_ms])
                        for key, _, mark in held])
                renewing.ok()
                for (key, entry, mark), extended in zip(held, results, strict=True):
                    guard, claim = entry
                    if self._held.get(key) is not entry or claim.lease != mark:
                        continue  # finished, or gave the lease up and took it again, meanwhile
                    if int(extended):
                        guard.extend(asked + self.lease_ttl * LEASE_SAFETY)
                    else:
                        log.warning("coordination: lost the lease on %s", key.label())
                        guard.lose("was taken over")
            except Exception as exc:  # e.g. Redis unreachable; the deadlines lapse by themselves
                renewing.failed(type(exc).__name__)

    # -- helpers -----------------------------------------------------------------------------

    async def _take(self, key: ConversationKey, *, poke: bool = False) -> str | None:
        """The lease's mark if this worker took it now (``None``: someone holds it). With
        ``poke``, a holder on another worker that may be keeping its lease for more is told
        that a message waits (see the module docstring)."""
        asked = asyncio.get_running_loop().time()
        mark = f"{self.worker}/{next(self._marks)}"
        async with bounded():
            holder = await self._take_script(keys=[self.keys.lease(key)],
                                             args=[mark, self._ttl_ms])
        if holder is None:
            self._granted[mark] = asked
            return mark
        worker = str(holder).rpartition("/")[0]
        if poke and self.linger > 0 and worker and worker != self.worker:
            await self.relay.poke(worker, member(key))
        return None

    async def _give_up(self, claim: Claim) -> None:
        """Delete the claim's lease if it is still the one the claim took (idempotent)."""
        mark, claim.lease = claim.lease, None
        if mark is None:
            return
        self._granted.pop(mark, None)
        try:
            async with bounded():
                await self._release(keys=[self.keys.lease(claim.key)], args=[mark])
        except (RedisError, OSError, TimeoutError) as exc:
            # The lease lapses by itself; the sweep hands what is left to a worker.
            self._redis_down.failed(type(exc).__name__)

    async def _store(self, op: Callable[..., Awaitable[T]], *args: object) -> T:
        """Run a database step, waiting out an outage with a backoff (the lease guard ends
        the wait if the lease goes meanwhile)."""
        delay = STORE_RETRY
        while True:
            try:
                result = await op(*args)
            except OSError as exc:
                self._store_down.failed(kind_of(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_STORE_RETRY)
                continue
            self._store_down.ok()
            return result

    async def _prune(self) -> None:
        """Now and then, forget rows answered long enough ago (any worker may)."""
        now = asyncio.get_running_loop().time()
        if now - self._pruned < 600:
            return
        self._pruned = now
        try:
            await self.inbox.prune(KEEP_ANSWERED)
        except OSError as exc:
            log.warning("coordination: pruning answered messages failed (%s)", kind_of(exc))

