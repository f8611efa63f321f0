"""The router: inbound messages -> their conversation, one turn at a time per conversation.

Every inbound message is recorded in its session on receipt (before any turn runs), then
queued. A conversation with queued messages has exactly one worker task, which answers them
one by one in arrival order (each gets its own turn; they are not merged) and exits when the
queue is empty, so an idle conversation holds no task. Conversations run concurrently up to
``max_concurrent_turns``. Duplicate deliveries (same platform id) are dropped before they reach
a session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from channels.base import ReplySink
from gateway.dedup import Deduplicator, MemoryDeduplicator
from gateway.messages import ChannelContext, ConversationKey, Inbound
from gateway.metrics import Metrics
from gateway.registry import ConversationRegistry
from gateway.turn import AgentLoop

log = logging.getLogger("gateway.router")

SinkFactory = Callable[[Inbound], ReplySink]


@dataclass(frozen=True, slots=True)
class Accepted:
    """What :meth:`Router.deliver` tells the channel: where the message was recorded."""

    session_id: str | None
    duplicate: bool = False


@dataclass(slots=True)
class _Item:
    inbound: Inbound
    index: int
    sink: ReplySink


class RouterClosedError(RuntimeError):
    """The router is shutting down and takes no new messages."""


class Router:
    """Routes inbound messages to turns. Use as an async context manager (owns its tasks)."""

    def __init__(
        self,
        *,
        registry: ConversationRegistry,
        loop: AgentLoop,
        sink_for: SinkFactory,
        metrics: Metrics,
        max_concurrent_turns: int = 32,
        dedup: Deduplicator | None = None,
    ) -> None:
        self.registry = registry
        self.loop = loop
        self.sink_for = sink_for
        self.metrics = metrics
        self.dedup = dedup or MemoryDeduplicator()
        self._slots = asyncio.Semaphore(max_concurrent_turns)
        self._queues: dict[ConversationKey, deque[_Item]] = {}
        self._workers: dict[ConversationKey, asyncio.Task[None]] = {}
        self._closing = False
        self._group: asyncio.TaskGroup | None = None
        registry.is_busy = self.is_busy

    async def __aenter__(self) -> Router:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._group is None:
            return
        await self.drain(0)
        group, self._group = self._group, None
        await group.__aexit__(exc_type, exc, tb)

    def is_busy(self, key: ConversationKey) -> bool:
        return key in self._workers

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def deliver(self, inbound: Inbound, sink: ReplySink | None = None) -> Accepted:
        """Record ``inbound`` in its session and queue its turn. Returns once recorded."""
        if self._closing:
            raise RouterClosedError("the gateway is shutting down")
        channel = inbound.key.channel
        if inbound.platform_id is not None and not await self.dedup.first_time(
            f"{channel}:{inbound.key.tenant}:{inbound.platform_id}"
        ):
            self.metrics.duplicates.labels(channel=channel).inc()
            return Accepted(session_id=None, duplicate=True)
        self.metrics.inbound.labels(channel=channel).inc()
        if is_new_command(inbound.text):
            return await self._new_session(inbound, sink)
        conv = await self.registry.get(inbound.key, context_of(inbound))
        meta: dict[str, object] = {"sender": inbound.sender.id}
        if inbound.sender.name:
            meta["name"] = inbound.sender.name
        if inbound.platform_id is not None:
            meta["platform_id"] = inbound.platform_id
        index = await conv.receive({"role": "user", "content": inbound.text}, meta)
        item = _Item(inbound, index, sink or self.sink_for(inbound))
        self._queues.setdefault(inbound.key, deque()).append(item)
        self.metrics.queue_depth.inc()
        if inbound.key not in self._workers:
            assert self._group is not None, "use the router as an async context manager"
            self._workers[inbound.key] = self._group.create_task(self._work(inbound.key))
        return Accepted(session_id=conv.session_id)

    async def _new_session(self, inbound: Inbound, sink: ReplySink | None) -> Accepted:
        """``/new``: the conversation continues in a fresh session (after queued turns)."""
        while inbound.key in self._workers:  # let queued turns finish in the old session
            await asyncio.wait([self._workers[inbound.key]])
        conv = await self.registry.rotate(inbound.key, context_of(inbound))
        await (sink or self.sink_for(inbound)).finish(
            f"Started a new conversation (session {conv.session_id})."
        )
        return Accepted(session_id=conv.session_id)

    async def _work(self, key: ConversationKey) -> None:
        queue = self._queues[key]
        try:
            while queue:
                item = queue.popleft()
                self.metrics.queue_depth.dec()
                async with self._slots:
                    await self._turn(key, item)
        finally:
            self._workers.pop(key, None)
            if not queue:
                self._queues.pop(key, None)

    async def _turn(self, key: ConversationKey, item: _Item) -> None:
        conv = await self.registry.get(key, context_of(item.inbound))
        conv.context = context_of(item.inbound)
        self.metrics.active_turns.inc()
        started = time.perf_counter()
        status = "error"
        try:
            result = await self.loop.run_turn(conv, item.index, item.sink)
            status = result.status
        except Exception:
            log.exception("session %s: turn failed", conv.session_id)
            with contextlib.suppress(Exception):
                await item.sink.fail(self.loop.settings.apology)
        finally:
            self.metrics.active_turns.dec()
            self.metrics.turns.labels(channel=key.channel, outcome=status).inc()
            log.debug("turn %s in %.1f ms", key.label(), (time.perf_counter() - started) * 1000)

    async def drain(self, grace: float) -> None:
        """Stop taking input; let running turns finish for ``grace`` seconds, then cancel."""
        self._closing = True
        workers = list(self._workers.values())
        if workers and grace > 0:
            await asyncio.wait(workers, timeout=grace)
        for task in self._workers.values():
            task.cancel()


def is_new_command(text: str) -> bool:
    """``/new`` or ``/new@botname`` (Telegram groups address commands to a bot)."""
    word = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    return word == "/new" or word.startswith("/new@")


def context_of(inbound: Inbound) -> ChannelContext:
    return ChannelContext(
        channel=inbound.key.channel,
        chat_type=inbound.chat_type,
        speaker=inbound.sender.name or inbound.sender.id,
        tenant=inbound.key.tenant,
    )
