"""Erasure across workers over Redis pub/sub (:class:`gateway.edge.erasure.ErasureBus`).

The process that runs an erasure publishes ``hold`` on ``{p}erasure``; every worker holds the
channel still (its router's pauses) and pushes its answer onto the run's reply list
(``{p}erasure:<run>``, expiring); the publisher waits for as many answers as ``PUBLISH``
said subscribers got the message, then erases, then publishes ``release`` with the sessions
it changed, which every worker drops from its memory before it lets go. When the person's
sessions called MCP servers, ``release`` names them too: every worker empties its own stderr
logs of those servers (its data folder may not be the publisher's) and pushes what it emptied
onto ``{p}erasure:<run>:done``, which the publisher waits for (at most the hold's timeout)
and reports. A worker that never
hears ``release`` (the publisher died) lets go by itself after :data:`RELEASE_AFTER` times
the hold's timeout, dropping nothing (its copies are checked against the store as it
takes a conversation again, :mod:`gateway.delivery.registry`).

Why Redis and not PostgreSQL ``NOTIFY``: ``PUBLISH`` answers with the number of subscribers
that received the message, so the publisher knows exactly how many confirmations to wait for
(``NOTIFY`` says nothing of its listeners, and counting live workers some other way would
need a registry of its own); the workers already keep a Redis connection; and a message lost
with Redis is lost before anything is deleted (the publisher gives up, having changed
nothing). Messages name a tenant, a channel, session ids and MCP server names, never a person's id
or text.
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
from gateway.edge.erasure import Changed, ErasureRefusedError, Hold, Holder, OwnErasure
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
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._own: OwnErasure | None = None
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
        others: list[str] = []
        try:
            others = await self._confirmed(reply, count, timeout)
            yield changed
        finally:
            done = f"{reply}:done"
            release: dict[str, Any] = {"op": "release", "run": run,
                                       "sessions": sorted(changed.sessions)}
            if changed.mcp_servers:
                release.update(servers=sorted(changed.mcp_servers), done=done)
            with contextlib.suppress(RedisError, OSError):
                await self.redis.publish(self.channel, orjson.dumps(release))
                await self.redis.delete(reply)
            if changed.mcp_servers and others:
                await self._emptied(done, others, changed, timeout)

    async def _emptied(self, done: str, others: list[str], changed: Changed,
                       timeout: float) -> None:  # noqa: ASYNC109
        """What each other worker emptied of its own, into ``changed.elsewhere``; a line
        for each one that did not say within ``timeout`` (the erasure itself is done)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        waiting = set(others)
        try:
            while waiting:
                got = await self.redis.blpop([done], timeout=max(deadline - loop.time(), 0.01))
                if got is None:
                    break
                answer = orjson.loads(got[1])
                worker = str(answer.get("worker"))
                waiting.discard(worker)
                changed.elsewhere.extend(f"mcp-log {worker}:{name}"
                                         for name in answer.get("removed") or ())
                if answer.get("error"):
                    changed.elsewhere.append(f"failed {worker}: {answer['error']}")
        except (RedisError, OSError) as exc:
            changed.elsewhere.append(f"unconfirmed (Redis: {type(exc).__name__})")
        finally:
            with contextlib.suppress(RedisError, OSError):
                await self.redis.delete(done)
        changed.elsewhere.extend(f"unconfirmed {worker}: its MCP logs (no answer in time)"
                                 for worker in sorted(waiting))

    async def _confirmed(self, reply: str, count: int,
                         timeout: float) -> list[str]:  # noqa: ASYNC109
        """Wait for ``count`` confirmations; the other workers that gave them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        others: list[str] = []
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
            if answer.get("worker") != self.worker:
                others.append(str(answer.get("worker")))
        return others

    async def serve(self, holder: Holder, started: asyncio.Event | None = None,
                    own: OwnErasure | None = None) -> None:
        """Answer other processes' holds until cancelled (reconnecting after Redis errors);
        ``started`` is set once subscribed (a hold published from then on reaches us);
        ``own`` empties this worker's logs of the MCP servers a release names."""
        self._own = own
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
                waiting.set_result(message)
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
        released: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[run] = released
        try:
            async with holder.holding(Hold(str(message["tenant"]), str(message["channel"])),
                                      timeout):
                log.info("erasure: holding the %s conversations of tenant %s still for %s",
                         message["channel"], message["tenant"], message.get("from"))
                await self._answer(reply, {"ok": True})
                try:
                    release = await asyncio.wait_for(released, timeout * RELEASE_AFTER)
                except TimeoutError:
                    log.warning("erasure: no release from the erasing process; letting go")
                    return
                await holder.drop([str(s) for s in release.get("sessions") or ()])
                if release.get("done"):
                    await self._empty_own(release)
        except ErasureRefusedError as exc:
            await self._answer(reply, {"ok": False, "error": str(exc)})
        finally:
            self._waiting.pop(run, None)

    async def _empty_own(self, release: dict[str, Any]) -> None:
        """Empty this worker's logs of the servers ``release`` names and say which (an
        error is said too: the erasing process reports it, the erasure itself is done)."""
        servers = [str(s) for s in release.get("servers") or ()]
        body: dict[str, Any] = {"removed": []}
        if self._own is not None and servers:
            try:
                body["removed"] = await self._own(servers)
            except OSError as exc:
                log.warning("erasure: could not empty this worker's MCP logs (%s)",
                            type(exc).__name__)
                body["error"] = f"its MCP logs could not be emptied ({type(exc).__name__})"
        await self._answer(str(release["done"]), body)

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
