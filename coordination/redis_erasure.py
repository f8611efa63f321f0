"""Erasure across workers over Redis pub/sub (:class:`gateway.edge.erasure.ErasureBus`).

The process that runs an erasure publishes ``hold`` on ``{p}erasure``; every worker holds the
channel still (its router's pauses) and pushes its answer onto the run's reply list
(``{p}erasure:<run>``, expiring); the publisher waits for as many answers as ``PUBLISH``
said subscribers got the message, then erases, then publishes ``release`` with the sessions
it changed, which every worker drops from its memory before it lets go. A worker that never
hears ``release`` (the publisher died) lets go by itself after :data:`RELEASE_AFTER` times
the hold's timeout, dropping nothing (its copies are checked against the store as it
takes a conversation again, :mod:`gateway.delivery.registry`).

Why Redis and not PostgreSQL ``NOTIFY``: ``PUBLISH`` answers with the number of subscribers
that received the message, so the publisher knows exactly how many confirmations to wait for
(``NOTIFY`` says nothing of its listeners, and counting live workers some other way would
need a registry of its own); the workers already keep a Redis connection; and a message lost
with Redis is lost before anything is deleted (the publisher gives up, having changed
nothing). Messages name a tenant, a channel and session ids, never a person's id or text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from coordination.keys import Keys
from gateway.edge.erasure import Changed, ErasureRefusedError, Hold, Holder
from gateway.edge.tasks import stop

log = logging.getLogger(__name__)

RELEASE_AFTER = 4.0
"""A worker waits at most this many times the hold's timeout for ``release``."""
REPLY_TTL_MS = 120_000


class RedisErasureBus:
    """See the module docstring. ``worker``: this process's id (its own requests are
    answered at once: the process that erases holds its own conversations itself)."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, worker: str) -> None:
        self.redis = redis
        self.keys = keys
        self.worker = worker
        self.channel = f"{keys.prefix}erasure"
        self._waiting: dict[str, asyncio.Future[list[str]]] = {}
        self._holding: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def others(self, hold: Hold, timeout: float) -> AsyncIterator[Changed]:  # noqa: ASYNC109
        run = secrets.token_hex(8)
        reply = f"{self.channel}:{run}"
        changed = Changed()
        message = {"op": "hold", "run": run, "from": self.worker, "reply": reply,
                   "tenant": hold.tenant, "channel": hold.channel, "timeout": timeout}
        try:
            count = int(await self.redis.publish(self.channel, orjson.dumps(message)))
        except (RedisError, OSError) as exc:
            raise ErasureRefusedError(
                f"the other workers could not be reached (Redis: {type(exc).__name__})") from exc
        try:
            await self._confirmed(reply, count, timeout)
            yield changed
        finally:
            with contextlib.suppress(RedisError, OSError):
                await self.redis.publish(self.channel, orjson.dumps(
                    {"op": "release", "run": run, "sessions": sorted(changed.sessions)}))
                await self.redis.delete(reply)

    async def _confirmed(self, reply: str, count: int, timeout: float) -> None:  # noqa: ASYNC109
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for n in range(count):
            left = deadline - loop.time()
            try:
                got = await self.redis.blpop([reply], timeout=max(left, 0.01))
            except (RedisError, OSError) as exc:
                raise ErasureRefusedError(
                    f"the other workers could not be reached (Redis: {type(exc).__name__})"
                ) from exc
            if got is None:
                raise ErasureRefusedError(
                    f"{count - n} of {count} worker(s) did not confirm within {timeout:g} s")
            answer = orjson.loads(got[1])
            if not answer.get("ok"):
                raise ErasureRefusedError(f"worker {answer.get('worker')}: {answer.get('error')}")

    async def serve(self, holder: Holder, started: asyncio.Event | None = None) -> None:
        """Answer other processes' holds until cancelled (reconnecting after Redis errors);
        ``started`` is set once subscribed (a hold published from then on reaches us)."""
        pubsub = await self.subscribe()
        if started is not None:
            started.set()
        try:
            while True:
                try:
                    found = await pubsub.get_message(ignore_subscribe_messages=True,
                                                     timeout=1.0)
                except (RedisError, OSError) as exc:
                    log.warning("erasure: lost the Redis subscription (%s); subscribing again",
                                type(exc).__name__)
                    await _closed(pubsub)
                    await asyncio.sleep(1.0)
                    pubsub = await self.subscribe()
                    continue
                if found is not None and found.get("type") == "message":
                    self._handle(holder, found["data"])
        finally:
            for task in list(self._holding):
                await stop(task)
            await _closed(pubsub)

    async def subscribe(self) -> Any:
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(self.channel)
        return pubsub

    def _handle(self, holder: Holder, data: str | bytes) -> None:
        try:
            message = orjson.loads(data)
            op = message["op"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if op == "release":
            waiting = self._waiting.get(str(message.get("run")))
            if waiting is not None and not waiting.done():
                waiting.set_result([str(s) for s in message.get("sessions") or ()])
        elif op == "hold":
            task = asyncio.get_running_loop().create_task(self._hold(holder, message))
            self._holding.add(task)
            task.add_done_callback(self._holding.discard)

    async def _hold(self, holder: Holder, message: dict[str, Any]) -> None:
        run, reply = str(message["run"]), str(message["reply"])
        if message.get("from") == self.worker:  # the erasing process holds its own
            await self._answer(reply, {"ok": True})
            return
        timeout = float(message.get("timeout") or 30.0)
        released: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self._waiting[run] = released
        try:
            async with holder.holding(Hold(str(message["tenant"]), str(message["channel"])),
                                      timeout):
                log.info("erasure: holding the %s conversations of tenant %s still for %s",
                         message["channel"], message["tenant"], message.get("from"))
                await self._answer(reply, {"ok": True})
                try:
                    sessions = await asyncio.wait_for(released, timeout * RELEASE_AFTER)
                except TimeoutError:
                    log.warning("erasure: no release from the erasing process; letting go")
                    return
                await holder.drop(sessions)
        except ErasureRefusedError as exc:
            await self._answer(reply, {"ok": False, "error": str(exc)})
        finally:
            self._waiting.pop(run, None)

    async def _answer(self, reply: str, body: dict[str, Any]) -> None:
        data = orjson.dumps({"worker": self.worker, **body})
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.rpush(reply, data)
                pipe.pexpire(reply, REPLY_TTL_MS)
                await pipe.execute()
        except (RedisError, OSError) as exc:  # the publisher then gives up: nothing erased
            log.warning("erasure: could not answer a hold (%s)", type(exc).__name__)


async def _closed(pubsub: Any) -> None:
    with contextlib.suppress(RedisError, OSError):
        await pubsub.aclose()
