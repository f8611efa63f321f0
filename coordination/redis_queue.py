"""Conversations shared by workers through Redis: a queue and a fenced lease per conversation.

A worker that receives a message pushes it onto its conversation's queue and, in the same
script, tries to take the conversation's lease (``SET NX PX`` with its owner id); on success
the fencing counter is incremented and its value is the claim's token, which the registry
hands to the session store (a worker holding an older token cannot append any more). The
holder serves the queue head, removes it only once the turn has finished, and releases the
lease in the script that finds the queue empty (see :mod:`.scripts`). While it serves, one
renewal task extends every held lease each ``ttl/3`` (compare-and-extend); a claim's serving
block runs under a deadline ``LEASE_SAFETY * ttl`` after the last confirmed extension, so a
worker cut off from Redis stops before anyone else can take over.

A worker that dies leaves its lease to lapse. Every worker sweeps the ``active`` set every
``ttl/3`` or so and adopts conversations that have items and no holder; the head item comes
back marked ``resumed`` (the ``inflight`` key names the item a holder had started), and the
router finds out from the session log whether it was recorded or answered already.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from coordination import scripts
from coordination.keys import Keys, decode_item, encode_item, key_of, member
from coordination.relay import Relay
from gateway.coordination import Claim, Entered, LeaseLostError, QueueItem
from gateway.messages import ConversationKey
from gateway.tasks import bounded

log = logging.getLogger("gateway.coordination")

LEASE_SAFETY = 0.8
"""A held lease is trusted for this fraction of its ttl after the last confirmed extension
(the margin covers clock drift and the time a reply from Redis takes)."""
ROUTER_DEDUP_TTL = 6 * 3600
"""Seconds the router remembers a platform id (Slack resends after reconnects within hours)."""


@dataclass(slots=True)
class _Held:
    claim: Claim
    timeout: asyncio.Timeout


class RedisConversations:
    """See the module docstring and :class:`gateway.coordination.base.ConversationQueue`."""

    records_on_receipt = False

    def __init__(self, redis: aioredis.Redis, keys: Keys, worker: str, relay: Relay, *,
                 lease_ttl: float) -> None:
        self._redis = redis
        self.keys = keys
        self.worker = worker
        self.relay = relay
        self.lease_ttl = lease_ttl
        self._ttl_ms = max(1, int(lease_ttl * 1000))
        self._enqueue = redis.register_script(scripts.ENQUEUE)
        self._advance = redis.register_script(scripts.ADVANCE)
        self._release = redis.register_script(scripts.RELEASE)
        self._extend = redis.register_script(scripts.EXTEND)
        self._adopt = redis.register_script(scripts.ADOPT)
        self._refence = redis.register_script(scripts.REFENCE)
        self._held: dict[ConversationKey, _Held] = {}
        self._granted: dict[ConversationKey, float] = {}  # loop time the lease was asked for
        self._done: dict[ConversationKey, str] = {}  # finished head, popped by the next script
        self._origins: dict[str, tuple[str, bool]] = {}  # item id -> (receiver, relayed)
        self._claims: dict[str, Claim] = {}  # item id -> the claim its enter() got

    @property
    def queued(self) -> int:
        """Messages this worker received whose turn has not started yet (relayed ones)."""
        return self.relay.waiting

    @property
    def held(self) -> int:
        return len(self._held)

    def _conv_keys(self, key: ConversationKey) -> list[str]:
        return [self.keys.lease(key), self.keys.queue(key), self.keys.inflight(key),
                self.keys.active]

    async def enter(self, item: QueueItem, dedup_key: str | None = None) -> Entered:
        # The dedup check and the push are one script: an id counts as seen exactly when its
        # message is queued, so a retry after a lost reply is never a duplicate of nothing.
        key = item.inbound.key
        asked = asyncio.get_running_loop().time()
        dedup = self.keys.dedup("router", dedup_key or "-")
        try:
            async with bounded():
                result = int(await self._enqueue(
                    keys=[dedup, self.keys.queue(key), self.keys.lease(key),
                          self.keys.fence(key), self.keys.active],
                    args=[encode_item(item, self.worker), ROUTER_DEDUP_TTL, self.worker,
                          self._ttl_ms, member(key), "1" if dedup_key else "0", item.id],
                ))
                original = str(await self._redis.get(dedup) or "") if result < 0 else ""
        except BaseException:
            self.relay.forget(item.id)
            raise
        if result < 0:
            self.relay.forget(item.id)
            return Entered(duplicate=True, original=original)
        if result > 0:
            self._granted[key] = asked
            self._claims[item.id] = Claim(key, result)
        return Entered()

    async def keep(self, item: QueueItem) -> Claim | None:
        return self._claims.pop(item.id, None)  # queued (and maybe claimed) by enter

    async def withdraw(self, item: QueueItem) -> None:
        self.relay.forget(item.id)

    def on_recorded(self, item: QueueItem) -> asyncio.Future[str] | None:
        if item.sink is None:
            return None
        return self.relay.expect(item.id, item.sink)

    def rotation_pending(self, key: ConversationKey) -> bool:
        return False  # every message is recorded as its turn starts

    def check(self, claim: Claim) -> None:
        held = self._held.get(claim.key)
        if held is not None and held.claim is claim and (
                asyncio.get_running_loop().time() >= (held.timeout.when() or float("inf"))):
            raise LeaseLostError(f"lease on {claim.key.label()} may have lapsed")

    async def settled(self, item_id: str, within: float) -> str | None:
        return None

    @asynccontextmanager
    async def holding(self, claim: Claim) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        granted = self._granted.pop(claim.key, loop.time())
        timeout = asyncio.timeout_at(granted + self.lease_ttl * LEASE_SAFETY)
        try:
            async with timeout:
                self._held[claim.key] = _Held(claim, timeout)
                yield
        except TimeoutError as exc:
            if timeout.expired():
                raise LeaseLostError(f"lease on {claim.key.label()} lapsed") from exc
            raise
        finally:
            held = self._held.get(claim.key)
            if held is not None and held.claim is claim:
                del self._held[claim.key]

    async def next(self, claim: Claim) -> QueueItem | None:
        key = claim.key
        async with bounded():
            reply = await self._advance(
                keys=self._conv_keys(key),
                args=[self.worker, self._done.pop(key, ""), member(key)],
            )
        status = _text(reply[0])
        if status == "lost":
            raise LeaseLostError(f"lease on {key.label()} was taken over")
        if status == "empty":
            return None
        wire = decode_item(_text(reply[1]), resumed=_text(reply[2]) == "1")
        item = wire.item
        if wire.relay:
            item.sink = self.relay.sink(item.id, wire.origin)
        self._origins[item.id] = (wire.origin, wire.relay)
        return item

    async def done(self, claim: Claim, item: QueueItem) -> None:
        # Popped by the next script this claim runs (next or release): one round trip a turn.
        self._done[claim.key] = item.id
        self._origins.pop(item.id, None)

    async def release(self, claim: Claim) -> None:
        key = claim.key
        self._granted.pop(key, None)
        try:
            async with bounded():
                await self._release(keys=self._conv_keys(key),
                                    args=[self.worker, self._done.pop(key, ""), member(key)])
        except (RedisError, TimeoutError) as exc:
            # The lease lapses by itself; others adopt what is left.
            log.warning("coordination: releasing %s failed (%s)", key.label(),
                        type(exc).__name__)

    async def refence(self, claim: Claim, at_least: int) -> None:
        async with bounded():
            token = int(await self._refence(keys=[self.keys.lease(claim.key),
                                                  self.keys.fence(claim.key)],
                                            args=[self.worker, at_least]))
        if token == 0:
            raise LeaseLostError(f"lease on {claim.key.label()} was taken over")
        claim.token = token

    async def recorded(self, item: QueueItem, session_id: str) -> None:
        origin, relayed = self._origins.get(item.id, ("", False))
        if relayed:
            await self.relay.recorded(item.id, origin, session_id)

    async def adoptions(self) -> AsyncIterator[Claim]:
        interval = max(0.1, self.lease_ttl / 3)
        while True:
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))  # workers spread out
            try:
                async with bounded():
                    claims = await self.sweep()
            except Exception as exc:  # the next sweep tries again; never end the adoptions
                log.warning("coordination: sweep failed (%s)", type(exc).__name__)
                continue
            for claim in claims:
                yield claim

    async def sweep(self) -> list[Claim]:
        """Take the lease of every conversation that has items and no holder."""
        found = await self._redis.smembers(self.keys.active)
        candidates = [k for k in (key_of(_text(m)) for m in found) if k not in self._held]
        if not candidates:
            return []
        asked = asyncio.get_running_loop().time()
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in candidates:
                await self._adopt(keys=[self.keys.lease(key), self.keys.queue(key),
                                        self.keys.fence(key), self.keys.active],
                                  args=[self.worker, self._ttl_ms, member(key)], client=pipe)
            tokens = await pipe.execute()
        claims = []
        for key, token in zip(candidates, tokens, strict=True):
            if int(token) > 0:
                self._granted[key] = asked
                claims.append(Claim(key, int(token)))
                log.info("coordination: took over %s (token %d)", key.label(), int(token))
        return claims

    async def renew_forever(self) -> None:
        """Extend every held lease each ``ttl/3``; a lease found taken is given up at once."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            held = list(self._held.values())
            if not held:
                continue
            asked = loop.time()
            try:
                async with bounded(), self._redis.pipeline(transaction=False) as pipe:
                    for entry in held:
                        await self._extend(keys=[self.keys.lease(entry.claim.key)],
                                           args=[self.worker, self._ttl_ms], client=pipe)
                    results = await pipe.execute()
            except (RedisError, TimeoutError) as exc:
                # The deadlines lapse by themselves if this goes on.
                log.warning("coordination: lease renewal failed (%s)", type(exc).__name__)
                continue
            for entry, extended in zip(held, results, strict=True):
                if self._held.get(entry.claim.key) is not entry or entry.timeout.expired():
                    continue  # finished, or already cut off, while we asked
                if int(extended):
                    entry.timeout.reschedule(asked + self.lease_ttl * LEASE_SAFETY)
                else:
                    log.warning("coordination: lost the lease on %s",
                                entry.claim.key.label())
                    entry.timeout.reschedule(loop.time())


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
