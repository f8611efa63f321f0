"""The router: inbound messages -> their conversation, one turn at a time per conversation.

Every inbound message is recorded in its session on receipt (before any turn runs), then
queued. A conversation with queued messages has exactly one worker task, which answers them
one by one in arrival order (each gets its own turn; they are not merged) and exits when the
queue is empty, so an idle conversation holds no task. Conversations run concurrently up to
``max_concurrent_turns``. Duplicate deliveries (same platform id) are dropped before they reach
a session.

Where the queue lives and who serves a conversation is the coordinator's
(:class:`~gateway.coordination.base.ConversationQueue`): in one process (the default) it is an
in-memory deque and messages are recorded on receipt, as above. Shared by several workers
(Redis), a message is queued in Redis and recorded by whichever worker holds the
conversation's lease, as its turn starts, under the lease's fencing token; an item whose
worker died mid-turn is taken over and finished without being recorded twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from gateway import commands
from gateway.channel import Accepted, ReplySink, RouterClosedError
from gateway.commands import CommandCall, CommandHandler
from gateway.conversation import Conversation
from gateway.coordination import Claim, ConversationQueue, ItemKind, LeaseLostError, QueueItem
from gateway.dedup import Deduplicator
from gateway.media.notice import with_notice
from gateway.messages import ChannelContext, ConversationKey, Inbound, answerable
from gateway.metrics import Metrics
from gateway.registry import ConversationRegistry
from gateway.speakers import context_of, user_message
from gateway.takeover import locate, prepare_rerun
from gateway.turn import AgentLoop
from sessions.errors import StaleWriterError

log = logging.getLogger("gateway.router")

SinkFactory = Callable[[Inbound], ReplySink]

NOT_HERE = "That command is not available here."

ACK_WAIT = 10.0
"""Shared mode: seconds ``deliver`` waits for a message with its own sink to be recorded (so
the channel can name the session); past that it returns once the message is queued."""


class Router:
    """Routes inbound messages to turns. Use as an async context manager (owns its tasks)."""

    def __init__(
        self,
        *,
        registry: ConversationRegistry,
        loop: AgentLoop,
        sink_for: SinkFactory,
        metrics: Metrics,
        dedup: Deduplicator,
        conversations: ConversationQueue,
        max_concurrent_turns: int = 32,
        handlers: Mapping[str, CommandHandler] | None = None,
    ) -> None:
        self.registry = registry
        self.loop = loop
        self.sink_for = sink_for
        self.metrics = metrics
        self.dedup = dedup
        self.conversations = conversations
        self.handlers: Mapping[str, CommandHandler] = dict(handlers or {})
        """Chat commands that need the gateway's services, by name (``forget``)."""
        self._slots = asyncio.Semaphore(max_concurrent_turns)
        self._workers: dict[ConversationKey, asyncio.Task[None]] = {}
        # Deliveries between registry.get() and their worker's start, per conversation: the
        # registry must not close the session in that window (the message would be lost and
        # its turn would fail), so they count as busy.
        self._receiving: dict[ConversationKey, int] = {}
        self._adopter: asyncio.Task[None] | None = None
        self._closing = False
        self._group: asyncio.TaskGroup | None = None
        registry.is_busy = self.is_busy

    @property
    def shared(self) -> bool:
        """True when several workers serve conversations (messages recorded by the holder)."""
        return not self.conversations.records_on_receipt

    async def __aenter__(self) -> Router:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        if self.shared:
            self._adopter = self._group.create_task(self._adopt())
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
        return key in self._workers or key in self._receiving

    @property
    def queued(self) -> int:
        # (The queue_depth gauge is set from this when /metrics is scraped.)
        return self.conversations.queued

    async def deliver(self, inbound: Inbound, sink: ReplySink | None = None) -> Accepted:
        """Record ``inbound`` in its session and queue its turn. Returns once recorded.

        Shared mode: returns once the message is queued in Redis (then nothing acknowledged is
        lost even if this worker dies); a message with its own ``sink`` is waited for until
        its turn records it, up to :data:`ACK_WAIT` seconds, so the session can be named.
        """
        if self._closing:
            raise RouterClosedError("the gateway is shutting down")
        channel = inbound.key.channel
        dedup_key = (None if inbound.platform_id is None
                     else f"{channel}:{inbound.key.tenant}:{inbound.platform_id}")
        if self.shared:
            return await self._deliver_shared(inbound, sink, dedup_key)
        if dedup_key is not None and not await self.dedup.first_time(dedup_key):
            self.metrics.duplicates.labels(channel=channel).inc()
            return Accepted(session_id=None, duplicate=True)
        try:
            accepted = await self._deliver_local(inbound, sink)
        except BaseException:
            if dedup_key is not None:  # not kept: the platform's redelivery must be taken
                await self.dedup.forget(dedup_key)
            raise
        if dedup_key is not None:
            await self.dedup.keep(dedup_key)
        return accepted

    async def _deliver_local(self, inbound: Inbound, sink: ReplySink | None) -> Accepted:
        self.metrics.inbound.labels(channel=inbound.key.channel).inc()
        command = commands.parse(inbound.text)
        if command is not None and (reply := commands.answer(command)) is not None:
            await (sink or self.sink_for(inbound)).finish(reply)  # /help, /start: nothing kept
            return Accepted(session_id=None)
        if command is commands.NEW:
            return await self._new_session(inbound, sink)
        if command is not None:  # one with a handler (or none here): answered, never kept
            await self._after_queued(inbound)
            await self._command(inbound, sink or self.sink_for(inbound))
            return Accepted(session_id=None)
        key = inbound.key
        conv = await self.registry.get(key, context_of(inbound))
        # Counted from the moment get() returns (no await in between) until the worker runs.
        self._receiving[key] = self._receiving.get(key, 0) + 1
        try:
            index = await conv.receive(user_message(inbound), meta_of(inbound))
            item = QueueItem(inbound, sink or self.sink_for(inbound), index)
            self._start((await self.conversations.submit(item)).claim)
        finally:
            if self._receiving[key] == 1:
                del self._receiving[key]
            else:
                self._receiving[key] -= 1
        return Accepted(session_id=conv.session_id)

    async def _deliver_shared(self, inbound: Inbound, sink: ReplySink | None,
                              dedup_key: str | None) -> Accepted:
        command = commands.parse(inbound.text)
        if command is not None and (reply := commands.answer(command)) is not None:
            await (sink or self.sink_for(inbound)).finish(reply)  # /help, /start: nothing kept
            return Accepted(session_id=None)
        if command not in (None, commands.NEW) and command.name not in self.handlers:
            await (sink or self.sink_for(inbound)).finish(NOT_HERE)
            return Accepted(session_id=None)
        # The dedup check and the push are one atomic step: an id is marked seen exactly when
        # its message is queued, so a client retrying after a lost reply is never told
        # "duplicate" for a message that was not kept.
        kind: ItemKind = "message"
        if command is commands.NEW:
            kind = "new"
        elif command is not None:
            kind = "command"  # answered by its handler under the lease, in order
        item = QueueItem(inbound, sink, kind=kind)
        ticket = await self.conversations.submit(item, dedup_key)
        if ticket.duplicate:
            self.metrics.duplicates.labels(channel=inbound.key.channel).inc()
            return Accepted(session_id=None, duplicate=True)
        self.metrics.inbound.labels(channel=inbound.key.channel).inc()
        self._start(ticket.claim)
        if sink is None or kind == "command":  # a command is never recorded
            return Accepted(session_id=None)
        return Accepted(session_id=await self.conversations.wait_recorded(item, ACK_WAIT))

    def _start(self, claim: Claim | None) -> None:
        """Start serving the claimed conversation (no-op without a claim)."""
        if claim is None:
            return
        assert self._group is not None, "use the router as an async context manager"
        self._workers[claim.key] = self._group.create_task(self._work(claim))

    async def _adopt(self) -> None:
        """Serve conversations whose worker went away (shared mode)."""
        async for claim in self.conversations.adoptions():
            if self._closing:
                await self.conversations.release(claim)
            else:
                self._start(claim)

    async def _after_queued(self, inbound: Inbound) -> None:
        """Wait until the conversation's queued turns are done (commands run in order)."""
        while inbound.key in self._workers:
            await asyncio.wait([self._workers[inbound.key]])

    async def _command(self, inbound: Inbound, sink: ReplySink) -> None:
        """A command with a handler (:mod:`gateway.commands`): run it, answer, record nothing."""
        command = commands.parse(inbound.text)
        handler = self.handlers.get(command.name) if command is not None else None
        if handler is None:
            await sink.finish(NOT_HERE)
            return
        call = CommandCall(inbound, context_of(inbound), commands.arguments(inbound.text))
        await sink.finish(await handler(call))

    async def _new_session(self, inbound: Inbound, sink: ReplySink | None) -> Accepted:
        """``/new``: the conversation continues in a fresh session (after queued turns)."""
        await self._after_queued(inbound)  # let queued turns finish in the old session
        conv = await self.registry.rotate(inbound.key, context_of(inbound))
        await (sink or self.sink_for(inbound)).finish(
            f"Started a new conversation (session {conv.session_id})."
        )
        return Accepted(session_id=conv.session_id)

    async def _work(self, claim: Claim) -> None:
        key = claim.key
        me = asyncio.current_task()
        finished = False
        try:
            async with self.conversations.holding(claim):
                while (item := await self.conversations.next(claim)) is not None:
                    async with self._slots:
                        await self._serve(claim, item)
                    await self.conversations.done(claim, item)
                    if self._closing and self.shared:
                        break  # hand the rest to the other workers
                else:
                    finished = True  # the claim ended with the queue
        except LeaseLostError as exc:
            log.warning("%s; another worker serves the conversation now", exc)
        except Exception as exc:  # e.g. Redis unreachable: the queue waits for its next holder
            log.error("%s: stopped serving the conversation (%s)", key.label(),
                      type(exc).__name__)
        finally:
            if self._workers.get(key) is me:
                del self._workers[key]
            if not finished:
                if self.shared:  # what an interrupted turn left in memory is not trusted
                    await self.registry.forget(key, fence=claim.token)
                await self.conversations.release(claim)

    async def _serve(self, claim: Claim, item: QueueItem) -> None:
        """One queued item: record it if it is not yet, then its turn (or the ``/new``)."""
        try:
            if item.index is not None:  # recorded on receipt
                await self._turn(item.inbound.key, item)
            else:
                await self._serve_shared(claim, item)
        except LeaseLostError:
            raise
        except StaleWriterError as exc:  # a worker with a newer token serves it now
            raise LeaseLostError(f"{item.inbound.key.label()}: session fenced off") from exc
        except Exception:  # e.g. the store is unreachable: this item fails, the queue goes on
            log.exception("%s: could not serve a message", item.inbound.key.label())
            with contextlib.suppress(Exception):
                await (item.sink or self.sink_for(item.inbound)).fail(self.loop.settings.apology)

    async def _serve_shared(self, claim: Claim, item: QueueItem) -> None:
        key, context = item.inbound.key, context_of(item.inbound)
        sink = item.sink or self.sink_for(item.inbound)
        if item.kind == "command":
            await self._command(item.inbound, sink)
            return
        if item.kind == "new":
            conv = await self._fenced(claim, context, rotate=not item.resumed)
            if item.resumed and conv.messages:  # the dead worker's rotation had not happened
                conv = await self._fenced(claim, context, rotate=True)
            await self.conversations.recorded(item, conv.session_id)
            await sink.finish(f"Started a new conversation (session {conv.session_id}).")
            return
        conv = await self._fenced(claim, context)
        found = None
        if item.resumed:
            data = await self.registry.store.read_log(key.tenant, conv.session_id)
            found = locate(data, item.id, max_iterations=self.loop.settings.max_iterations)
        if found is None:
            meta = {**meta_of(item.inbound), "item": item.id}
            index = await conv.receive(user_message(item.inbound), meta)
        elif found.status == "interrupted":
            log.info("%s: finishing a turn a stopped worker had started", key.label())
            index = found.index
            await prepare_rerun(conv, found)
        else:  # answered before its worker stopped: send the answer again, record nothing
            await self.conversations.recorded(item, conv.session_id)
            if found.status == "apologised":
                await sink.fail(self.loop.settings.apology)
            else:
                await sink.finish(found.text)
            return
        await self.conversations.recorded(item, conv.session_id)
        await self._turn(key, dataclasses.replace(item, index=index, sink=sink), claim.token)

    async def _fenced(self, claim: Claim, context: ChannelContext, *,
                      rotate: bool = False) -> Conversation:
        """The conversation under the claim's token, raising the token once if the session
        holds a higher one (it was written before this deployment shared its store)."""
        for attempt in (1, 2):
            try:
                if rotate:
                    return await self.registry.rotate(claim.key, context, fence=claim.token)
                return await self.registry.get(claim.key, context, fence=claim.token)
            except StaleWriterError as exc:
                if attempt == 2 or claim.token is None or exc.token != claim.token:
                    raise
                await self.conversations.refence(claim, exc.current + 1)
        raise AssertionError("unreachable")

    async def _turn(self, key: ConversationKey, item: QueueItem,
                    fence: int | None = None) -> None:
        assert item.index is not None, "recorded before its turn"
        assert item.sink is not None, "the router gives every item a sink"
        conv = await self.registry.get(key, context_of(item.inbound), fence=fence)
        conv.context = context_of(item.inbound)
        if notice_only(item.inbound):
            # Every file was refused and there is no text: the notice (recorded with the
            # message) is the whole answer. The message joins the conversation in its turn's
            # place, like any other, but no provider call is made.
            conv.begin(item.index)
            await item.sink.finish(item.inbound.notice or "")
            self.metrics.turns.labels(channel=key.channel, outcome="refused").inc()
            return
        sink = with_notice(item.sink, item.inbound.notice)  # refused files first, same reply
        self.metrics.active_turns.inc()
        started = time.perf_counter()
        status = "error"
        try:
            result = await self.loop.run_turn(conv, item.index, sink)
            status = result.status
        except Exception:
            log.exception("session %s: turn failed", conv.session_id)
            with contextlib.suppress(Exception):
                await sink.fail(self.loop.settings.apology)
        finally:
            self.metrics.active_turns.dec()
            self.metrics.turns.labels(channel=key.channel, outcome=status).inc()
            log.debug("turn %s in %.1f ms", key.label(), (time.perf_counter() - started) * 1000)

    async def drain(self, grace: float) -> None:
        """Stop taking input; let running turns finish for ``grace`` seconds, then cancel."""
        self._closing = True
        if self._adopter is not None:
            self._adopter.cancel()
        workers = list(self._workers.values())
        if workers and grace > 0:
            await asyncio.wait(workers, timeout=grace)
        for task in self._workers.values():
            task.cancel()


def meta_of(inbound: Inbound) -> dict[str, Any]:
    """The ``meta`` recorded with an inbound message (who sent it, its platform id, and what
    the person was told about files that were refused)."""
    meta: dict[str, Any] = {"sender": inbound.sender.id}
    if inbound.sender.name:
        meta["name"] = inbound.sender.name
    if inbound.platform_id is not None:
        meta["platform_id"] = inbound.platform_id
    if inbound.notice:
        meta["notice"] = inbound.notice
    return meta


def notice_only(inbound: Inbound) -> bool:
    """Every file was refused and there is no text: the notice is the whole answer (recorded
    with the message), and no provider call is made."""
    return bool(inbound.notice) and not answerable(inbound)

