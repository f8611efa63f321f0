"""The router: inbound messages -> their conversation, one turn at a time per conversation.

**Receiving** is a claim that is kept or released (:class:`~gateway.coordination.
ConversationQueue`): the message is first recorded as *owed*, durably (a platform id
delivered before is a duplicate, answered with what the first delivery got: the gateway's one
dedup step), then, in one process, recorded in its session at once, then queued for its turn.
Only then does :meth:`Router.deliver` return, so a channel acknowledges only what is recorded;
when the store (or Redis) cannot record it, ``deliver`` raises
:class:`~gateway.errors.UnavailableError` and the channel does not acknowledge it (503, or the
Telegram offset held), so the platform delivers it again.

A message with files to fetch after the acknowledgement (:func:`~gateway.messages.deferred`:
Slack's, whose Events API wants its answer within 3 seconds) is owed with their references
and recorded in its session only as its turn starts, once ``take_in`` (the media intake) has
downloaded and stored them: until then the owed item alone holds it (as it holds a message
queued behind a ``/new``, or every message where several workers share the queue), and a
restart or another worker fetches the files again from those references.

**Serving.** A conversation with queued items has exactly one worker task, which answers them
one by one in arrival order (each gets its own turn; they are not merged) and exits when the
queue is empty, so an idle conversation holds no task. Conversations run concurrently up to
``max_concurrent_turns``. Per item: ``/new`` starts a fresh session (in arrival order: later
messages go to the new session); a message not in its session yet is recorded (one that an
earlier run or a dead worker may have started, ``resumed``, is first looked up in the log,
:mod:`gateway.takeover`, so it is recorded and answered once); its turn runs; the session's
pending writes are flushed; then the item is marked answered (with several workers its final
reply itself waits until they are written, for as long as the lease holds, so a message is
never answered by two holders). An item whose session cannot be
opened or written before its turn (the store is down) is tried again with a backoff, never
dropped or apologised for.

Where the queue lives and who serves a conversation is the coordinator's: in one process an
in-memory deque over the owed journal; shared by several workers, PostgreSQL and Redis leases
(the holder records each message as its turn starts, under the lease's fencing token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from functools import partial
from types import TracebackType
from typing import Any

from gateway import commands
from gateway.answering import Answering
from gateway.channel import Accepted, Answer, ReplySink, RouterClosedError
from gateway.commands import CommandCall, CommandHandler
from gateway.conversation import Conversation
from gateway.coordination import (
    Claim,
    ConversationQueue,
    ItemKind,
    LeaseLostError,
    QueueItem,
    current_lease,
)
from gateway.episodes import Episode
from gateway.errors import NotRecordedError, UnavailableError, kind_of
from gateway.media.notice import with_notice
from gateway.messages import (
    ChannelContext,
    ConversationKey,
    Inbound,
    answerable,
)
from gateway.metrics import Metrics
from gateway.registry import ConversationRegistry
from gateway.speakers import context_of, user_message
from gateway.takeover import as_recorded, locate, prepare_rerun
from gateway.turn import AgentLoop
from sessions.errors import SessionError, SessionWriteError, StaleWriterError

log = logging.getLogger("gateway.router")

SinkFactory = Callable[[Inbound], ReplySink]
TakeIn = Callable[[Inbound], Awaitable[Inbound]]

NOT_HERE = "That command is not available here."

STORE_FAULTS: tuple[type[Exception], ...] = (OSError, SessionError, NotRecordedError)
"""What opening, reading or writing a session raises when the store is down or refuses."""
GONE = "NOT_FOUND"
"""The kind of a write refused because the session was deleted (erased) meanwhile."""
RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 10.0
"""Backoff (seconds) while the store cannot take an item's writes: doubled up to this."""


class Router:
    """Routes inbound messages to turns. Use as an async context manager (owns its tasks)."""

    def __init__(
        self,
        *,
        registry: ConversationRegistry,
        loop: AgentLoop,
        sink_for: SinkFactory,
        metrics: Metrics,
        conversations: ConversationQueue,
        max_concurrent_turns: int = 32,
        handlers: Mapping[str, CommandHandler] | None = None,
        retry_delay: float = RETRY_DELAY,
        wait_for_channels: bool = False,
        take_in: TakeIn | None = None,
    ) -> None:
        """``wait_for_channels``: owed conversations are served only once
        :meth:`channels_started` is called (their replies need the channels running).
        ``take_in``: takes a deferred message's files in as its turn starts (the media
        intake's ``prepare``)."""
        self.take_in = take_in
        self.registry = registry
        self.loop = loop
        self.sink_for = sink_for
        self.metrics = metrics
        self.conversations = conversations
        self.handlers: Mapping[str, CommandHandler] = dict(handlers or {})
        """Chat commands that need the gateway's services, by name (``forget``)."""
        self.retry_delay = retry_delay
        self._slots = asyncio.Semaphore(max_concurrent_turns)
        self._workers: dict[ConversationKey, asyncio.Task[None]] = {}
        # Deliveries between registry.get() and their worker's start, per conversation: the
        # registry must not close the session in that window (the message would be lost and
        # its turn would fail), so they count as busy.
        self._receiving: dict[ConversationKey, int] = {}
        self._adopter: asyncio.Task[None] | None = None
        self._channels = asyncio.Event()
        if not wait_for_channels:
            self._channels.set()
        self._closing = False
        self._group: asyncio.TaskGroup | None = None
        self._unrecorded = Episode(log, "recording inbound messages")
        self._unwritable = Episode(log, "serving messages (session store)")
        registry.is_busy = self.is_busy

    @property
    def shared(self) -> bool:
        """True when several workers serve conversations (messages recorded by the holder)."""
        return not self.conversations.records_on_receipt

    async def __aenter__(self) -> Router:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
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

    # -- receiving ---------------------------------------------------------------------------

    async def deliver(self, inbound: Inbound, sink: ReplySink | None = None) -> Accepted:
        """Record ``inbound`` durably and queue its turn; see the module docstring."""
        if self._closing:
            raise RouterClosedError("the gateway is shutting down")
        command = commands.parse(inbound.text)
        if command is not None and (reply := commands.answer(command)) is not None:
            await (sink or self.sink_for(inbound)).finish(reply)  # /help, /start: nothing kept
            return Accepted(session_id=None)
        if command not in (None, commands.NEW) and command.name not in self.handlers:
            await (sink or self.sink_for(inbound)).finish(NOT_HERE)
            return Accepted(session_id=None)
        kind: ItemKind = "message"
        if command is commands.NEW:
            kind = "new"
        elif command is not None:
            kind = "command"  # answered by its handler in its turn's place, never recorded
        item = QueueItem(inbound, sink, kind=kind)
        # Asked before enter: where several workers share the queue, the item may be served
        # (and recorded) anywhere the moment it is in.
        recorded = (self.conversations.on_recorded(item)
                    if sink is not None and kind != "command" else None)
        entered = await self.conversations.enter(item, dedup_key(inbound))
        channel = inbound.key.channel
        if entered.duplicate:
            self.metrics.duplicates.labels(channel=channel).inc()
            assert entered.original is not None, "a duplicate names the delivery it repeats"
            return Accepted(session_id=entered.session_id, duplicate=True,
                            earlier=partial(self._earlier, inbound.key, entered.original))
        key = inbound.key
        # Behind a queued /new, a message waits to be recorded in the new session; one with
        # files still to fetch is recorded once they are (as its turn starts).
        now = (self.conversations.records_on_receipt and item.kind == "message"
               and not inbound.attachments and not self.conversations.rotation_pending(key))
        try:
            if now:
                await self._record_on_receipt(item)  # counts as receiving once opened
            claim = await self.conversations.keep(item)
            if claim is not None and self._closing:
                # Received while the gateway stops (drain began during the recording): the
                # message is recorded and owed, and is answered after the next start (or by
                # another worker). A turn started now would outlive the drain and answer
                # after the owed journal closed, so the answer would be sent again later.
                await self.conversations.release(claim)
            else:
                self._start(claim)
        finally:
            if now and key in self._receiving:
                if self._receiving[key] == 1:
                    del self._receiving[key]
                else:
                    self._receiving[key] -= 1
        self.metrics.inbound.labels(channel=channel).inc()
        # Several workers: whichever worker serves it records and answers it, and its reply is
        # relayed here through Redis; the log is where the answer is still found if the relay
        # loses it (Redis restarted or flushed meanwhile).
        answered = (partial(self._earlier, key, item.id)
                    if self.shared and recorded is not None else None)
        return Accepted(session_id=item.session, recorded=recorded, answered=answered)

    async def _record_on_receipt(self, item: QueueItem) -> None:
        """One process: the message goes into its session now (withdrawn if it cannot)."""
        inbound = item.inbound
        key = inbound.key
        try:
            conv = await self.registry.get(key, context_of(inbound))
            # Busy from the moment get() returns (no await in between) until its worker runs.
            self._receiving[key] = self._receiving.get(key, 0) + 1
            item.index = await conv.receive(user_message(inbound), meta_of(item))
        except BaseException as exc:
            await self.conversations.withdraw(item)
            if isinstance(exc, STORE_FAULTS):
                kind = kind_of(exc)
                self._unrecorded.failed(kind)
                raise UnavailableError("store", kind) from exc
            raise
        self._unrecorded.ok()
        item.session = conv.session_id
        await self.conversations.recorded(item, conv.session_id)

    async def _earlier(self, key: ConversationKey, item_id: str,
                       within: float) -> Answer | None:
        """The answer the first delivery of a duplicate got (waiting for it if needed)."""
        session = await self.conversations.settled(item_id, within)
        if not session:
            return None
        found = locate(await self.registry.store.read_log(key.tenant, session), item_id,
                       max_iterations=self.loop.settings.max_iterations)
        if found is None or found.status == "interrupted":
            return None
        if found.status == "apologised":
            return Answer(session, False, self.loop.settings.apology)
        return Answer(session, True, found.text)

    # -- serving -----------------------------------------------------------------------------

    def _start(self, claim: Claim | None) -> None:
        """Start serving the claimed conversation (no-op without a claim)."""
        if claim is None:
            return
        assert self._group is not None, "use the router as an async context manager"
        self._workers[claim.key] = self._group.create_task(self._work(claim))

    def channels_started(self) -> None:
        """The channels run: owed conversations may be served now."""
        self._channels.set()

    async def _adopt(self) -> None:
        """Serve conversations left owed: by the last run (one process) or by a worker that
        went away (several)."""
        await self._channels.wait()
        async for claim in self.conversations.adoptions():
            if self._closing or claim.key in self._workers:
                await self.conversations.release(claim)
            else:
                self._start(claim)

    async def _command(self, inbound: Inbound, sink: ReplySink) -> None:
        """A command with a handler (:mod:`gateway.commands`): run it, answer, record nothing."""
        command = commands.parse(inbound.text)
        handler = self.handlers.get(command.name) if command is not None else None
        if handler is None:
            await sink.finish(NOT_HERE)
            return
        call = CommandCall(inbound, context_of(inbound), commands.arguments(inbound.text))
        await sink.finish(await handler(call))

    async def _work(self, claim: Claim) -> None:
        key = claim.key
        me = asyncio.current_task()
        finished = False
        lease = current_lease.set(partial(self.conversations.check, claim))
        try:
            async with self.conversations.holding(claim):
                delay = self.retry_delay
                while (item := await self.conversations.next(claim)) is not None:
                    if not await self._serve(claim, item):
                        await asyncio.sleep(delay)  # the store is down: the same item again
                        delay = min(delay * 2, MAX_RETRY_DELAY)
                        continue
                    delay = self.retry_delay
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
            current_lease.reset(lease)
            if self._workers.get(key) is me:
                del self._workers[key]
            if not finished:
                if self.shared:  # what an interrupted turn left in memory is not trusted
                    await self.registry.forget(key, fence=claim.token)
                await self.conversations.release(claim)

    async def _serve(self, claim: Claim, item: QueueItem) -> bool:
        """One item: prepare it (record, or find how far it got), run its turn, make its
        writes durable. False when the store failed before the turn: try again later."""
        try:
            prepared = await self._prepare(claim, item)
        except LeaseLostError:
            raise
        except StaleWriterError as exc:  # a worker with a newer token serves it now
            raise LeaseLostError(f"{item.inbound.key.label()}: session fenced off") from exc
        except NotRecordedError as exc:
            if exc.fenced:
                raise LeaseLostError(f"{item.inbound.key.label()}: session fenced off") from exc
            if exc.kind == GONE and self.shared:
                # Erased under this holder (a /forget of the person served elsewhere): the
                # retry opens the conversation from the store again, not this copy.
                await self.registry.forget(item.inbound.key)
            self._unwritable.failed(exc.kind)
            return False
        except STORE_FAULTS as exc:
            self._unwritable.failed(kind_of(exc))
            return False
        except Exception:  # a bug: answer with the apology once rather than loop on it
            log.exception("%s: could not serve a message", item.inbound.key.label())
            with contextlib.suppress(Exception):
                await self._sink(claim, item).fail(self.loop.settings.apology)
            return True
        self._unwritable.ok()
        if prepared is None:
            return True
        conv, sink = prepared
        async with self._slots:
            try:
                await self._turn(conv, item, sink)
            except BaseException:
                sink.abandon()  # no final reply from here (the next holder answers)
                raise
        if self.shared:
            # The next holder opens the session under a newer token, fencing off whatever
            # this one has not written yet: it is written before the item counts as answered
            # (the final reply waited for it already, _saved; this covers a turn that ended
            # without one). One process keeps it, written ahead of the next append or at close.
            await self._flush(conv)
        return True

    async def _prepare(self, claim: Claim, item: QueueItem
                       ) -> tuple[Conversation, Answering] | None:
        """Record the item if it is not yet (``None``: nothing left to run, it was answered)."""
        key, context = item.inbound.key, context_of(item.inbound)
        if item.kind == "new":
            await self._rotate(claim, item, context)
            return None
        if item.kind == "command":
            await self._command(item.inbound, self._sink(claim, item))
            return None
        conv = await self._fenced(claim, context)
        if item.index is not None and item.session == conv.session_id:
            return conv, self._sink(claim, item, conv)  # recorded on receipt
        found = None
        if item.resumed:
            data = await self.registry.read_log(key, conv)
            if data is None:  # the copy is not the log: open it again, under our token
                conv = await self._fenced(claim, context)
                data = await self.registry.read_log(key, conv)
            if data is None:
                raise LeaseLostError(f"{key.label()}: the session moved on under this holder")
            found = locate(data, item.id, max_iterations=self.loop.settings.max_iterations)
        if found is None:
            if item.inbound.attachments:  # fetched after the acknowledgement: now
                item.inbound = await self._take_in(item.inbound)
            item.index = await conv.receive(user_message(item.inbound), meta_of(item))
        elif found.status == "interrupted":
            if found.started:
                log.info("%s: finishing a turn that was cut off", key.label())
            if item.inbound.attachments:  # taken in before the stop: as the log holds them
                item.inbound = as_recorded(item.inbound, found)
            item.index = found.index
            await prepare_rerun(conv, found)
        else:  # answered before it was marked so: send the answer again, record nothing
            item.session = conv.session_id
            await self.conversations.recorded(item, conv.session_id)
            sink = self._sink(claim, item, conv)
            if found.status == "apologised":
                await sink.fail(self.loop.settings.apology)
            else:
                await sink.finish(found.text)
            return None
        item.session = conv.session_id
        await self.conversations.recorded(item, conv.session_id)
        return conv, self._sink(claim, item, conv)

    async def _take_in(self, inbound: Inbound) -> Inbound:
        if self.take_in is None:  # a wiring bug: the item is answered with the apology
            raise RuntimeError("a message with files to fetch, and no intake to take them in")
        return await self.take_in(inbound)

    def _sink(self, claim: Claim, item: QueueItem,
              conv: Conversation | None = None) -> Answering:
        """Where the item's reply goes (opened now, as its turn starts), marking the item
        answered the moment its reply is out: the narrowest window there is between a
        platform taking a reply and the gateway knowing it did.

        Several workers: the final reply waits until ``conv``'s entries are in the log
        (:meth:`_saved`). The next holder opens the session under a newer token, which
        drops whatever this one has not written yet; an answer sent before its entries
        were saved would be answered again by that holder, and be missing from the log.
        A reply abandoned so (or by a turn cut off) has its streamed preview retracted."""
        sink = item.sink or self.sink_for(item.inbound)
        answered = partial(self.conversations.done, claim, item)
        if not self.shared or conv is None:
            return Answering(sink, answered)
        return Answering(sink, answered, partial(self._saved, claim, conv), self._spawn)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in a task of the router's group (a turn's leftover that its
        cancellation must not cut short); dropped when the router has closed."""
        try:
            if self._group is None:
                raise RuntimeError("the router is closed")
            self._group.create_task(work)
        except RuntimeError:
            work.close()

    async def _saved(self, claim: Claim, conv: Conversation) -> None:
        """Wait until the conversation's pending entries are written (the store may be down:
        retried with a backoff, for as long as the lease holds), then check the lease once
        more. A lost lease ends the wait by :class:`LeaseLostError` (or the guard's cancel),
        and nothing is sent: the new holder finds the message unanswered and answers it."""
        await self._flush(conv)
        self.conversations.check(claim)

    async def _rotate(self, claim: Claim, item: QueueItem, context: ChannelContext) -> None:
        """``/new``: the conversation continues in a fresh session, from this point on."""
        conv = await self._fenced(claim, context, rotate=not item.resumed)
        if item.resumed and conv.messages:  # the rotation had not happened before the stop
            conv = await self._fenced(claim, context, rotate=True)
        item.session = conv.session_id
        await self.conversations.recorded(item, conv.session_id)
        await self._sink(claim, item, conv).finish(
            f"Started a new conversation (session {conv.session_id}).")

    async def _fenced(self, claim: Claim, context: ChannelContext, *,
                      rotate: bool = False) -> Conversation:
        """The conversation under the claim's token, raising the token once if the session
        holds a higher one (it was written before this deployment shared its store). The
        coordinator confirms the lease first: a holder whose lease passed on to the worker
        that wrote that token gets :class:`LeaseLostError` and hands the conversation back."""
        for attempt in (1, 2):
            try:
                if rotate:
                    return await self.registry.rotate(claim.key, context, fence=claim.token)
                return await self.registry.get(claim.key, context, fence=claim.token)
            except StaleWriterError as exc:
                if attempt == 2 or claim.token is None or exc.token != claim.token:
                    raise
                try:
                    await self.conversations.refence(claim, exc.current + 1)
                except LeaseLostError:
                    # A copy cached here is behind the new holder's log: never reuse it.
                    await self.registry.forget(claim.key)
                    raise
        raise AssertionError("unreachable")

    async def _turn(self, conv: Conversation, item: QueueItem, sink: ReplySink) -> None:
        assert item.index is not None, "recorded before its turn"
        key = item.inbound.key
        conv.context = context_of(item.inbound)
        if notice_only(item.inbound):
            # Every file was refused and there is no text: the notice (recorded with the
            # message) is the whole answer. The message joins the conversation in its turn's
            # place, like any other, but no provider call is made.
            conv.begin(item.index)
            await sink.finish(item.inbound.notice or "")
            self.metrics.turns.labels(channel=key.channel, outcome="refused").inc()
            return
        sink = with_notice(sink, item.inbound.notice)  # refused files first, same reply
        self.metrics.active_turns.inc()
        started = time.perf_counter()
        status = "error"
        try:
            result = await self.loop.run_turn(conv, item.index, sink)
            status = result.status
        except (LeaseLostError, StaleWriterError):
            raise
        except NotRecordedError as exc:
            if exc.fenced:  # before a provider call, or instead of a refused answer: the
                # conversation is handed back, and its new holder answers
                raise LeaseLostError(f"{key.label()}: session fenced off") from exc
            log.warning("session %s: turn stopped, the log refused a write (%s)",
                        conv.session_id, exc.kind)
            await self._apologise(sink)
        except Exception:
            log.exception("session %s: turn failed", conv.session_id)
            await self._apologise(sink)
        finally:
            self.metrics.active_turns.dec()
            self.metrics.turns.labels(channel=key.channel, outcome=status).inc()
            log.debug("turn %s in %.1f ms", key.label(), (time.perf_counter() - started) * 1000)

    async def _apologise(self, sink: ReplySink) -> None:
        """The apology after a failed turn. A lost lease is raised (the sink waited for the
        turn's entries and the lease went meanwhile: the new holder answers); anything else a
        sink raises is a bug there, and the turn is over anyway."""
        try:
            await sink.fail(self.loop.settings.apology)
        except LeaseLostError:
            raise
        except Exception:
            log.exception("could not send the apology")

    async def _flush(self, conv: Conversation) -> None:
        """Write what the turn's failed writes left pending (retried with a backoff while the
        store is down; a lost lease ends it)."""
        writer = conv.recorder.writer
        delay = self.retry_delay
        while writer.pending_bytes:
            try:
                await writer.flush()
            except StaleWriterError as exc:
                raise LeaseLostError(f"{conv.key.label()}: session fenced off") from exc
            except SessionWriteError as exc:
                self._unwritable.failed(exc.kind)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)
        self._unwritable.ok()

    async def drain(self, grace: float) -> None:
        """Stop taking input; let running turns finish for ``grace`` seconds, then cancel.
        Items not answered by then stay owed (answered after the next start, or by another
        worker)."""
        self._closing = True
        if self._adopter is not None:
            self._adopter.cancel()
        workers = list(self._workers.values())
        if workers and grace > 0:
            await asyncio.wait(workers, timeout=grace)
        for task in self._workers.values():
            task.cancel()


def dedup_key(inbound: Inbound) -> str | None:
    """The duplicate check's key: the platform id within its conversation (a web client's
    message ids are its own per conversation; a platform's ids are unique anyway)."""
    if inbound.platform_id is None:
        return None
    return f"{inbound.key.tenant}:{inbound.key.label()}:{inbound.platform_id}"


def meta_of(item: QueueItem) -> dict[str, Any]:
    """The ``meta`` recorded with an inbound message: who sent it, its platform id, and the
    item id (so an interrupted turn can be found again after a restart or a takeover)."""
    inbound = item.inbound
    meta: dict[str, Any] = {"sender": inbound.sender.id}
    if inbound.sender.name:
        meta["name"] = inbound.sender.name
    if inbound.platform_id is not None:
        meta["platform_id"] = inbound.platform_id
    if inbound.notice:
        meta["notice"] = inbound.notice
    meta["item"] = item.id
    return meta


def notice_only(inbound: Inbound) -> bool:
    """Every file was refused and there is no text: the notice is the whole answer (recorded
    with the message), and no provider call is made."""
    return bool(inbound.notice) and not answerable(inbound)

