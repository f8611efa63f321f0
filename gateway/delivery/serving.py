"""Serving one queued item: record it (or find how far an earlier holder got), run its
turn, answer it, make its writes durable.

The router (:mod:`gateway.delivery.router`) decides who serves a conversation and when; an
:class:`ItemServer` does it for each item the router's worker task takes off the queue, in
order. Per item: ``/new`` starts a fresh session (in arrival order: later messages go to the
new session); a command with a handler is answered by it, never recorded; a message not in
its session yet is recorded (one that an earlier run or a dead worker may have started,
``resumed``, is first looked up in the log, :mod:`gateway.delivery.takeover`, so it is recorded and
answered once); its turn runs; the session's pending writes are flushed. An item whose
session cannot be opened or written before its turn (the store is down) is tried again with a
backoff, never dropped or apologised for.

With several workers the holder opens the session under its lease's fencing token, and the
final reply waits until the turn's entries are written, for as long as the lease holds
(:meth:`ItemServer._saved`), so a message is never answered by two holders. The apology after
an unexpected failure, which no log entry fences, also waits for the coordinator to confirm
the lease at its source (:meth:`ItemServer._apologise`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import orjson

from gateway.agent.conversation import Conversation
from gateway.agent.loop import AgentLoop
from gateway.delivery.answering import Answering, Spawn
from gateway.delivery.limit import TurnLimit
from gateway.delivery.placing import SessionPlacement, place, placed_of
from gateway.delivery.registry import ConversationRegistry
from gateway.delivery.speakers import context_of, user_message
from gateway.delivery.takeover import Found, as_recorded, locate, prepare_rerun
from gateway.edge import commands
from gateway.edge.channel import Placed, ReplySink, RetractSink
from gateway.edge.commands import CommandCall, CommandHandler
from gateway.edge.coordination import Claim, ConversationQueue, LeaseLostError, QueueItem
from gateway.edge.episodes import Episode
from gateway.edge.errors import Failure, NotRecordedError, kind_of
from gateway.edge.messages import SCHEDULED, ChannelContext, Inbound, answerable
from gateway.edge.metrics import Metrics
from gateway.media.notice import with_notice
from sessions import entries
from sessions.errors import SessionError, SessionWriteError, StaleWriterError

log = logging.getLogger(__name__)

SinkFactory = Callable[[Inbound], ReplySink]
TakeIn = Callable[[Inbound], Awaitable[Inbound]]

NOT_HERE = "That command is not available here."

STORE_FAULTS: tuple[type[Exception], ...] = (OSError, SessionError, NotRecordedError)
"""What opening, reading or writing a session raises when the store is down or refuses."""
DOWNLOADS = 16
"""Files fetched as their turns start, at once at most (``GATEWAY_MAX_CONCURRENT_DOWNLOADS``):
each may hold up to ``GATEWAY_MAX_ATTACHMENT_BYTES`` in memory."""
RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 10.0
"""Backoff (seconds) while the store cannot take an item's writes: doubled up to this."""


class ItemServer:
    """Serves the items of conversations the caller holds (see the module docstring).

    ``spawn`` runs a turn's leftover (an abandoned reply's retraction) in a task of the
    router's group, which the turn's cancellation must not cut short."""

    def __init__(
        self,
        *,
        registry: ConversationRegistry,
        loop: AgentLoop,
        sink_for: SinkFactory,
        metrics: Metrics,
        conversations: ConversationQueue,
        handlers: Mapping[str, CommandHandler],
        spawn: Spawn,
        max_concurrent_turns: int | None = None,
        max_concurrent_downloads: int = DOWNLOADS,
        retry_delay: float = RETRY_DELAY,
        take_in: TakeIn | None = None,
    ) -> None:
        self.registry = registry
        self.loop = loop
        self.sink_for = sink_for
        self.metrics = metrics
        self.conversations = conversations
        self.handlers = handlers
        self.spawn = spawn
        self.retry_delay = retry_delay
        self.take_in = take_in
        self.turns = TurnLimit(max_concurrent_turns, waited=lambda: loop.caller.waited)
        """Turns running at once: ``max_concurrent_turns``, or derived (``None``)."""
        self._downloads = asyncio.Semaphore(max_concurrent_downloads)
        self._unwritable = Episode(log, "serving messages (session store)")

    @property
    def shared(self) -> bool:
        """True when several workers serve conversations (messages recorded by the holder)."""
        return not self.conversations.records_on_receipt

    async def serve(self, claim: Claim, item: QueueItem) -> bool:
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
            if exc.kind == Failure.GONE:
                # Erased under this holder (an erasure that did not reach it): the retry
                # opens the conversation from the store again, not this copy.
                await self.registry.forget(item.inbound.key)
            self._unwritable.failed(exc.kind)
            return False
        except STORE_FAULTS as exc:
            self._unwritable.failed(kind_of(exc))
            return False
        except Exception:  # a bug: answer with the apology once rather than loop on it
            log.exception("%s: could not serve a message", item.inbound.key.label())
            await self._apologise(claim, item)
            return True
        self._unwritable.ok()
        if prepared is None:
            return True
        conv, sink = prepared
        async with self.turns:
            try:
                await self._turn(claim, conv, item, sink)
            except BaseException:
                sink.abandon()  # no final reply from here (the next holder answers)
                raise
        self.turns.observe()
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
        # Read as the session was opened under this claim's token: an older holder may have
        # recorded the item there though this holder took it first (see the registry).
        opened = self.registry.opened_log(key)
        if item.index is not None and item.session == conv.session_id:
            return conv, self._sink(claim, item, conv)  # recorded on receipt
        found: Found | None = None
        # (A byte search for the id as the log spells it spares parsing a log without it.)
        if item.resumed or (opened is not None and orjson.dumps(item.id) in opened):
            data = opened or await self.registry.read_log(key, conv)
            if data is None:  # the copy is not the log: open it again, under our token
                conv = await self._fenced(claim, context)
                data = await self.registry.read_log(key, conv)
            if data is None:
                raise LeaseLostError(f"{key.label()}: the session moved on under this holder")
            found = locate(data, item.id, max_iterations=self.loop.settings.max_iterations)
        if found is None:
            if item.inbound.attachments:  # fetched after the acknowledgement: now
                return await self._take_in_and_record(claim, item, conv)
            item.index = await conv.receive(user_message(item.inbound), meta_of(item))
        elif found.status == "interrupted":
            if found.started:
                log.info("%s: finishing a turn that was cut off", key.label())
            if item.inbound.attachments:  # taken in before the stop: as the log holds them
                item.inbound = as_recorded(item.inbound, found)
            item.index = found.index
            await prepare_rerun(conv, found)
        else:  # answered before it was marked so: deliver the recorded answer, record nothing
            # (by editing the messages noted for it, where the platform allows: never a
            # second copy of it)
            item.session = conv.session_id
            item.index = found.index
            await self.conversations.recorded(item, conv.session_id)
            sink = self._sink(claim, item, conv, placed=placed_of(found.placed))
            if found.status == "apologised":
                await sink.fail(found.text or self.loop.settings.apology)
            else:
                await sink.finish(found.text)
            return None
        return await self._recorded(claim, item, conv,
                                    placed=placed_of(found.placed) if found else ())

    async def _take_in_and_record(self, claim: Claim, item: QueueItem,
                                  conv: Conversation) -> tuple[Conversation, Answering]:
        """A message whose files are fetched after the acknowledgement: download them now,
        within a download slot (a burst of large files is held to the bound on concurrent
        downloads rather than all in memory at once), while the person sees the reply being
        prepared
        (typing; Slack's reaction), then record it. The sink that showed the indicator carries
        the reply; a failure before it is handed over takes the indicator back."""
        channel_sink = item.sink or self.sink_for(item.inbound)
        try:
            async with self._downloads:
                await channel_sink.typing()
                item.inbound = await self._take_in(item.inbound)
            item.index = await conv.receive(user_message(item.inbound), meta_of(item))
            return await self._recorded(claim, item, conv, channel_sink)
        except Exception:
            if isinstance(channel_sink, RetractSink):  # no preview yet: only the indicator
                await channel_sink.retract()
            raise

    async def _recorded(self, claim: Claim, item: QueueItem, conv: Conversation,
                        opened: ReplySink | None = None, *, placed: tuple[Placed, ...] = ()
                        ) -> tuple[Conversation, Answering]:
        """The item is in ``conv``'s session: say so to the queue, and open its reply
        (``placed``: its answer's messages an earlier run noted, finished by editing them)."""
        item.session = conv.session_id
        await self.conversations.recorded(item, conv.session_id)
        return conv, self._sink(claim, item, conv, opened, placed=placed)

    async def _take_in(self, inbound: Inbound) -> Inbound:
        if self.take_in is None:  # a wiring bug: the item is answered with the apology
            raise RuntimeError("a message with files to fetch, and no intake to take them in")
        return await self.take_in(inbound)

    def _sink(self, claim: Claim, item: QueueItem, conv: Conversation | None = None,
              opened: ReplySink | None = None, *, placed: tuple[Placed, ...] = ()
              ) -> Answering:
        """Where the item's reply goes (opened now, as its turn starts), marking the item
        answered the moment its reply is out: the narrowest window there is between a
        platform taking a reply and the gateway knowing it did.

        Several workers: the final reply waits until ``conv``'s entries are in the log
        (:meth:`_saved`). The next holder opens the session under a newer token, which
        drops whatever this one has not written yet; an answer sent before its entries
        were saved would be answered again by that holder, and be missing from the log.
        A reply abandoned so (or by a turn cut off) has its streamed preview retracted.
        ``opened``: the item's channel sink, when it was opened before the turn (files).

        A message's answer is *placed* (:mod:`gateway.delivery.placing`): the sink notes in
        the log which platform messages carry it before its text goes in, and edits those
        an earlier run noted (``placed``) instead of sending them again."""
        sink = opened or item.sink or self.sink_for(item.inbound)
        if conv is not None and item.index is not None and item.kind == "message":
            place(sink, SessionPlacement(conv, item.id, item.index, self.metrics,
                                         known=placed, resumed=item.resumed))
        answered = partial(self.conversations.done, claim, item)
        if not self.shared or conv is None:
            return Answering(sink, answered)
        return Answering(sink, answered, partial(self._saved, claim, conv), self.spawn)

    async def _command(self, inbound: Inbound, sink: ReplySink) -> None:
        """A command with a handler (:mod:`gateway.edge.commands`): run it, answer, record
        nothing."""
        command = commands.parse(inbound.text)
        handler = self.handlers.get(command.name) if command is not None else None
        if handler is None:
            await sink.finish(NOT_HERE)
            return
        call = CommandCall(inbound, context_of(inbound), commands.arguments(inbound.text))
        await sink.finish(await handler(call))


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

    async def _turn(self, claim: Claim, conv: Conversation, item: QueueItem,
                    sink: ReplySink) -> None:
        assert item.index is not None, "recorded before its turn"
        key = item.inbound.key
        conv.context = context_of(item.inbound)
        if notice_only(item.inbound):
            # Every file was refused and there is no text: the notice (recorded with the
            # message) is the whole answer. The message joins the conversation in its turn's
            # place, like any other, but no provider call is made.
            conv.begin(item.index)
            notice = item.inbound.notice or ""
            # Recorded before it goes out, so a restart knows it did (and sends it no more).
            await conv.recorder.append([entries.reply(item.index, "notice", notice)])
            await conv.recorder.flush()
            await sink.finish(notice)
            self.metrics.turns.labels(channel=key.channel, outcome="refused").inc()
            return
        sink = with_notice(sink, item.inbound.notice)  # refused files first, same reply
        self.metrics.active_turns.inc()
        started = time.perf_counter()
        status = "error"
        try:
            result = await self.loop.run_turn(conv, item.index, sink,
                                              lease=partial(self.conversations.check, claim))
            status = result.status
        except (LeaseLostError, StaleWriterError):
            raise
        except NotRecordedError as exc:
            if exc.fenced:  # before a provider call, or instead of a refused answer: the
                # conversation is handed back, and its new holder answers
                raise LeaseLostError(f"{key.label()}: session fenced off") from exc
            log.warning("session %s: turn stopped, the log refused a write (%s)",
                        conv.session_id, exc.kind)
            await self._apologise(claim, item, sink, conv)
        except Exception:
            log.exception("session %s: turn failed", conv.session_id)
            await self._apologise(claim, item, sink, conv)
        finally:
            self.metrics.active_turns.dec()
            self.metrics.turns.labels(channel=key.channel, outcome=status).inc()
            log.debug("turn %s in %.1f ms", key.label(), (time.perf_counter() - started) * 1000)

    async def _apologise(self, claim: Claim, item: QueueItem, sink: ReplySink | None = None,
                         conv: Conversation | None = None) -> None:
        """The apology after an unexpected failure, in the item's turn or before it (``sink``:
        the turn's; else the item's, opened now).

        No log entry fences it, as an answer's own entry fences the answer (the store refuses
        it from a holder whose lease passed on, and the answer is not sent). So with several
        workers it waits for the turn's pending entries, then has the coordinator confirm at
        the source that this claim still holds the lease (:meth:`ConversationQueue.confirm`,
        not only the local deadline): a holder whose lease passed on, though its guard does
        not know yet, sends nothing, and :class:`LeaseLostError` hands the conversation back
        for the new holder to answer. Anything else raised here is a bug in the sink, and
        the item is over anyway."""
        apology = self.loop.settings.apology
        try:
            if self.shared:
                if conv is not None:
                    await self._flush(conv)
                await self.conversations.confirm(claim)
            if conv is not None and item.index is not None:
                # Recorded before it goes out, as an answer is, so a restart (or the next
                # holder) knows it went out; only once the lease is confirmed, or the next
                # holder would send an apology this holder never sent.
                written = await conv.recorder.append(
                    [entries.reply(item.index, "apology", apology)])
                if written.failure == Failure.FENCED:
                    raise LeaseLostError(f"{item.inbound.key.label()}: session fenced off")
                if self.shared:
                    await self._flush(conv)
                else:
                    await conv.recorder.flush()
            await (sink or self._sink(claim, item)).fail(apology)
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
    scheduled = inbound.meta.get(SCHEDULED)
    if isinstance(scheduled, dict):  # a scheduled turn: which schedule, who set it
        meta[SCHEDULED] = dict(scheduled)
    meta["item"] = item.id
    return meta


def notice_only(inbound: Inbound) -> bool:
    """Every file was refused and there is no text: the notice is the whole answer (recorded
    with the message), and no provider call is made."""
    return bool(inbound.notice) and not answerable(inbound)

