"""Replies across workers: a message received by one worker and served by another.

A channel that hands the router its own sink (the web chat: the sink is the waiting HTTP
request) needs the reply back on the worker that received the message. That worker keeps the
sink in :class:`Relay` under the item's id; the worker serving the conversation writes the
reply events into the receiver's inbox list (``{p}inbox:<worker>``, ``RPUSH``) through a
:class:`RelaySink`, and the receiver's reader task (``BLPOP``) plays them into the sink.

Events: ``poke`` (a message for a conversation whose lease this worker holds was received
elsewhere: :mod:`coordination.redis_queue`, "a lease kept a moment"), ``recorded`` (with the
session id, so the request can be acknowledged), ``typing``,
``delta`` (batched to one push per :data:`DELTA_INTERVAL`: the final text supersedes them),
``retract`` (the serving worker abandoned its reply: the deltas so far are void), ``finish``
and ``fail``. An inbox whose worker died expires after :data:`INBOX_TTL`; the reply
is in the session log regardless. Channels without their own sink (Telegram, Slack) need no
relay: the serving worker opens the channel's sink itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from coordination.keys import Keys
from gateway.edge.channel import ReplySink, RetractSink
from gateway.edge.tasks import bounded

log = logging.getLogger(__name__)

DELTA_INTERVAL = 0.05
INBOX_TTL = 600
WAITER_TTL = 3600.0
"""A reply that has not come within this many seconds is no longer waited for."""
POLL_SECONDS = 1
POP_MANY = 64


@dataclass(slots=True)
class _Waiter:
    sink: ReplySink
    recorded: asyncio.Future[str]
    created: float = field(default_factory=time.monotonic)


class RelaySink:
    """The serving worker's sink for an item whose receiver waits elsewhere."""

    def __init__(self, redis: aioredis.Redis, inbox: str, item_id: str) -> None:
        self._redis = redis
        self._inbox = inbox
        self._item = item_id
        self._typing_sent = False
        self._buffer: list[str] = []
        self._flushed = 0.0

    async def typing(self) -> None:
        if not self._typing_sent:
            self._typing_sent = True
            await push(self._redis, self._inbox, self._item, "typing", "")

    async def delta(self, text: str) -> None:
        self._buffer.append(text)
        now = time.monotonic()
        if now - self._flushed >= DELTA_INTERVAL:
            self._flushed = now
            chunk, self._buffer = "".join(self._buffer), []
            await push(self._redis, self._inbox, self._item, "delta", chunk)

    async def retract(self) -> None:
        self._buffer = []  # deltas not pushed yet belong to the abandoned reply too
        await push(self._redis, self._inbox, self._item, "retract", "")

    async def finish(self, text: str) -> None:
        await push(self._redis, self._inbox, self._item, "finish", text)

    async def fail(self, text: str) -> None:
        await push(self._redis, self._inbox, self._item, "fail", text)


async def push(redis: aioredis.Redis, inbox: str, item_id: str, kind: str, text: str) -> None:
    """One event into a receiver's inbox; a failure is logged, never raised (sink contract)."""
    event = orjson.dumps({"i": item_id, "k": kind, "t": text})
    try:
        async with bounded(), redis.pipeline(transaction=False) as pipe:
            pipe.rpush(inbox, event)
            pipe.expire(inbox, INBOX_TTL)
            await pipe.execute()
    except (RedisError, TimeoutError) as exc:
        log.warning("relay: could not pass a %s event on (%s)", kind, type(exc).__name__)


async def retract(sink: ReplySink) -> None:
    """Retract on ``sink`` when it can (:class:`gateway.edge.channel.RetractSink`)."""
    if isinstance(sink, RetractSink):
        await sink.retract()


class _LocalEnd:
    """The receiver's own sink, used directly when the receiver also serves the item."""

    def __init__(self, relay: Relay, item_id: str, sink: ReplySink) -> None:
        self._relay = relay
        self._item = item_id
        self._sink = sink

    async def typing(self) -> None:
        await self._sink.typing()

    async def delta(self, text: str) -> None:
        await self._sink.delta(text)

    async def retract(self) -> None:
        await retract(self._sink)

    async def finish(self, text: str) -> None:
        self._relay.forget(self._item)
        await self._sink.finish(text)

    async def fail(self, text: str) -> None:
        self._relay.forget(self._item)
        await self._sink.fail(text)


class Relay:
    """Both ends of the reply relay for one worker."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, worker: str) -> None:
        self._redis = redis
        self._keys = keys
        self.worker = worker
        self._waiters: dict[str, _Waiter] = {}
        self._pruned = time.monotonic()
        self._many = True  # BLMPOP until the server says it has none
        self.on_poke: Callable[[str], None] = lambda conversation: None
        """Called with the conversation a poke names (the queue sets it)."""

    @property
    def waiting(self) -> int:
        """Items received here that are not recorded yet (their turn has not started)."""
        return sum(1 for w in self._waiters.values() if not w.recorded.done())

    def expect(self, item_id: str, sink: ReplySink) -> asyncio.Future[str]:
        """The reply to ``item_id`` goes to ``sink`` (on this worker); the future gets the
        session id once the item is recorded."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters[item_id] = _Waiter(sink, future)
        return future

    def forget(self, item_id: str) -> None:
        waiter = self._waiters.pop(item_id, None)
        if waiter is not None and not waiter.recorded.done():
            waiter.recorded.cancel()

    def sink(self, item_id: str, origin: str) -> ReplySink:
        """Where the serving worker sends the reply to ``item_id``, received by ``origin``."""
        waiter = self._waiters.get(item_id) if origin == self.worker else None
        if waiter is not None:
            return _LocalEnd(self, item_id, waiter.sink)
        return RelaySink(self._redis, self._keys.inbox(origin), item_id)

    async def poke(self, worker: str, conversation: str) -> None:
        """Tell ``worker`` a message for ``conversation`` (which it holds) waits."""
        await push(self._redis, self._keys.inbox(worker), "", "poke", conversation)

    async def recorded(self, item_id: str, origin: str, session_id: str) -> None:
        if origin == self.worker:
            self._recorded(item_id, session_id)
        else:
            await push(self._redis, self._keys.inbox(origin), item_id, "recorded", session_id)

    async def wait_recorded(self, item_id: str, within: float) -> str | None:
        waiter = self._waiters.get(item_id)
        if waiter is None:
            return None
        done, _ = await asyncio.wait([waiter.recorded], timeout=within)
        if not done or waiter.recorded.cancelled():
            return None
        return waiter.recorded.result()

    def _recorded(self, item_id: str, session_id: str) -> None:
        waiter = self._waiters.get(item_id)
        if waiter is not None and not waiter.recorded.done():
            waiter.recorded.set_result(session_id)

    async def run(self) -> None:
        """The reader: play this worker's inbox into the waiting sinks (until cancelled)."""
        inbox = self._keys.inbox(self.worker)
        backoff = 0.1
        while True:
            try:
                async with bounded():
                    events = await self._pop(inbox)
            except (RedisError, TimeoutError) as exc:
                log.warning("relay: reading the inbox failed (%s); retrying",
                            type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            for event in events:
                await self._dispatch(event)
            self._prune()

    async def _pop(self, inbox: str) -> list[str | bytes]:
        """The events waiting (up to :data:`POP_MANY`) in one round trip, blocking up to
        :data:`POLL_SECONDS` for the first (``BLMPOP``; ``BLPOP``, one at a time, on a Redis
        older than 7.0)."""
        if self._many:
            try:
                popped = await self._redis.blmpop(POLL_SECONDS, 1, inbox, direction="LEFT",
                                                  count=POP_MANY)
            except ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._many = False
            else:
                if not popped:
                    return []
                values = popped[1]  # [key, [values...]]
                return list(values) if isinstance(values, list) else [values]
        single = await self._redis.blpop([inbox], timeout=POLL_SECONDS)
        return [single[1]] if single else []

    async def _dispatch(self, raw: str | bytes) -> None:
        event = orjson.loads(raw)
        item_id, kind, text = str(event["i"]), str(event["k"]), str(event["t"])
        if kind == "poke":
            self.on_poke(text)
            return
        if kind == "recorded":
            self._recorded(item_id, text)
            return
        waiter = self._waiters.get(item_id)
        if waiter is None:
            return  # the request gave up (timeout) or a resent answer after it was answered
        if kind == "typing":
            await waiter.sink.typing()
        elif kind == "delta":
            await waiter.sink.delta(text)
        elif kind == "retract":
            await retract(waiter.sink)
        else:
            self.forget(item_id)
            if kind == "finish":
                await waiter.sink.finish(text)
            else:
                await waiter.sink.fail(text)

    def _prune(self) -> None:
        now = time.monotonic()
        if now - self._pruned < 60:
            return
        self._pruned = now
        for item_id in [i for i, w in self._waiters.items() if now - w.created > WAITER_TTL]:
            self.forget(item_id)
