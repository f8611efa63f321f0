"""The router: inbound messages -> their conversation, one turn at a time per conversation.

**Receiving** is a claim that is kept or released (:class:`~gateway.edge.coordination.
ConversationQueue`): the message is first recorded as *owed*, durably (a platform id
delivered before is a duplicate, answered with what the first delivery got: the gateway's one
dedup step), then, in one process, recorded in its session at once, then queued for its turn.
Only then does :meth:`Router.deliver` return, so a channel acknowledges only what is recorded;
when the store (or Redis) cannot record it, ``deliver`` raises
:class:`~gateway.edge.errors.UnavailableError` and the channel does not acknowledge it (503, or the
Telegram offset held), so the platform delivers it again.

A message with files to fetch after the acknowledgement (:func:`~gateway.edge.messages.deferred`:
Slack's, whose Events API wants its answer within 3 seconds, and Telegram's, whose updates
are handled one after another) is owed with their references
and recorded in its session only as its turn starts, once ``take_in`` (the media intake) has
downloaded and stored them: until then the owed item alone holds it (as it holds a message
queued behind a ``/new``, or every message where several workers share the queue), and a
restart or another worker fetches the files again from those references.

**Serving.** A conversation with queued items has exactly one worker task, which answers them
one by one in arrival order (each gets its own turn; they are not merged) and exits when the
queue is empty, so an idle conversation holds no task. Conversations run concurrently up to
``max_concurrent_turns`` (derived from the model's latency and the CPU a turn costs when
``None``: :mod:`gateway.delivery.limit`). How each item is served (recorded or looked up in
the log, its turn run, its reply fenced) is :mod:`gateway.delivery.serving`'s; the item is
then marked answered.
An item whose session cannot be opened or written before its turn (the store is down) is
tried again with a backoff, never dropped or apologised for.

Where the queue lives and who serves a conversation is the coordinator's: in one process an
in-memory deque over the owed journal; shared by several workers, PostgreSQL and Redis leases
(the holder records each message as its turn starts, under the lease's fencing token).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from gateway.agent.loop import AgentLoop
from gateway.delivery.pause import Pauses
from gateway.delivery.registry import ConversationRegistry
from gateway.delivery.serving import (
    DOWNLOADS,
    MAX_RETRY_DELAY,
    NOT_HERE,
    RETRY_DELAY,
    STORE_FAULTS,
    ItemServer,
    SinkFactory,
    TakeIn,
    meta_of,
)
from gateway.delivery.speakers import context_of, user_message
from gateway.delivery.takeover import locate
from gateway.edge import commands
from gateway.edge.channel import Accepted, Answer, ReplySink, RouterClosedError
from gateway.edge.commands import CommandHandler
from gateway.edge.coordination import (
    Claim,
    ConversationQueue,
    ItemKind,
    LeaseLostError,
    QueueItem,
)
from gateway.edge.episodes import Episode
from gateway.edge.errors import UnavailableError, kind_of
from gateway.edge.messages import ConversationKey, Inbound
from gateway.edge.metrics import Metrics
from gateway.edge.tasks import stop

if TYPE_CHECKING:
    from gateway.edge.coordination import FencedStore

log = logging.getLogger(__name__)

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
        max_concurrent_turns: int | None = None,
        max_concurrent_downloads: int = DOWNLOADS,
        handlers: Mapping[str, CommandHandler] | None = None,
        retry_delay: float = RETRY_DELAY,
        wait_for_channels: bool = False,
        take_in: TakeIn | None = None,
        pauses: Pauses | None = None,
    ) -> None:
        """``wait_for_channels``: owed conversations are served only once
        :meth:`channels_started` is called (their replies need the channels running).
        ``take_in``: takes a deferred message's files in as its turn starts (the media
        intake's ``prepare``). ``pauses``: what erasures hold conversations still with (the
        composition root shares them with the erasure service; default: the router's own)."""
        self.registry = registry
        self.loop = loop
        self.sink_for = sink_for
        self.metrics = metrics
        self.conversations = conversations
        self.handlers: Mapping[str, CommandHandler] = dict(handlers or {})
        """Chat commands that need the gateway's services, by name (``forget``)."""
        self.retry_delay = retry_delay
        self._items = ItemServer(registry=registry, loop=loop, sink_for=sink_for,
                                 metrics=metrics, conversations=conversations,
                                 handlers=self.handlers, spawn=self._spawn,
                                 max_concurrent_turns=max_concurrent_turns,
                                 max_concurrent_downloads=max_concurrent_downloads,
                                 retry_delay=retry_delay, take_in=take_in)
        # Each worker holds its conversation in the registry while it serves an item, as a
        # delivery does from registry.get() until its worker starts: the registry must not
        # close the session under either (the message would be lost and its turn would fail).
        # Several workers' holders let go of it between items (see _work).
        self._workers: dict[ConversationKey, asyncio.Task[None]] = {}
        self._adopter: asyncio.Task[None] | None = None
        self._channels = asyncio.Event()
        if not wait_for_channels:
            self._channels.set()
        self._closing = False
        self._group: asyncio.TaskGroup | None = None
        self._unrecorded = Episode(log, "recording inbound messages")
        self.pauses = pauses if pauses is not None else Pauses(registry)
        """Holds conversations still for an erasure (receiving and serving wait on it)."""

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

    @property
    def serving(self) -> int:
        """Conversations a turn worker is serving now (0 with ``queued`` 0: all answered)."""
        return len(self._workers)

    async def idle(self) -> None:
        """Return once no conversation has a worker (every turn started so far has ended)."""
        while self._workers:
            await asyncio.wait(list(self._workers.values()))

    @property
    def closing(self) -> bool:
        """True once :meth:`drain` began: input is refused from then on."""
        return self._closing

    @property
    def queued(self) -> int:
        # (The queue_depth gauge is set from this when /metrics is scraped.)
        return self.conversations.queued

    @property
    def turn_limit(self) -> int:
        """Turns run at once at most now (the turn_limit gauge, set when scraped)."""
        return self._items.turns.limit

    # -- receiving ---------------------------------------------------------------------------

    async def deliver(self, inbound: Inbound, sink: ReplySink | None = None) -> Accepted:
        """Record ``inbound`` durably and queue its turn; see the module docstring. Waits
        while an erasure holds its conversation still (:mod:`gateway.delivery.pause`)."""
        async with self.pauses.active(inbound.key):
            return await self._deliver(inbound, sink)

    async def _deliver(self, inbound: Inbound, sink: ReplySink | None) -> Accepted:
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
        # files still to fetch is recorded once they are (as its turn starts), and one behind
        # it waits too, so the session keeps the order they came in.
        now = (self.conversations.records_on_receipt and item.kind == "message"
               and not inbound.attachments and not self.conversations.records_later(key))
        held = False
        try:
            if now:
                await self._record_on_receipt(item)  # held in the registry once opened
                held = True
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
            if held:
                self.registry.release(key)
        self.metrics.inbound.labels(channel=channel).inc()
        # Several workers: whichever worker serves it records and answers it, and its reply is
        # relayed here through Redis; the log is where the answer is still found if the relay
        # loses it (Redis restarted or flushed meanwhile).
        answered = (partial(self._watch, key, item.id, _Seen())
                    if self.shared and recorded is not None else None)
        return Accepted(session_id=item.session, recorded=recorded, answered=answered)

    async def _record_on_receipt(self, item: QueueItem) -> None:
        """One process: the message goes into its session now (withdrawn if it cannot). On
        return the conversation is held in the registry (the caller releases it once the
        worker runs); on a raise it is not."""
        inbound = item.inbound
        key = inbound.key
        held = False
        try:
            conv = await self.registry.get(key, context_of(inbound))
            # Held from the moment get() returns (no await in between) until its worker runs.
            self.registry.hold(key)
            held = True
            item.index = await conv.receive(user_message(inbound), meta_of(item))
        except BaseException as exc:
            if held:
                self.registry.release(key)
            await self.conversations.withdraw(item)
            if isinstance(exc, STORE_FAULTS):
                kind = kind_of(exc)
                self._unrecorded.failed(kind)
                raise UnavailableError("store", kind) from exc
            raise
        self._unrecorded.ok()
        item.session = conv.session_id
        try:
            await self.conversations.recorded(item, conv.session_id)
        except BaseException:
            self.registry.release(key)
            raise

    async def _earlier(self, key: ConversationKey, item_id: str,
                       within: float) -> Answer | None:
        """The answer the first delivery of a duplicate got (waiting for it if needed).

        With several workers the conversation's log is read first: an answer recorded there
        is the answer, whether or not the item is marked answered yet (the holder that
        recorded it may have died before its reply reached the waiting request; the next
        holder marks it only after its lease lapsed). So a browser's retry gets the recorded
        answer at once, and a waiting request's look-up finds it within one look."""
        if self.shared:
            latest = await self.registry.store.latest_session(key.tenant, key.label())
            if latest is not None:
                answer = await self._recorded_answer(key, latest, item_id)
                if answer is not None:
                    return answer
        session = await self.conversations.settled(item_id, within)
        if not session:
            return None
        return await self._recorded_answer(key, session, item_id)

    async def _watch(self, key: ConversationKey, item_id: str, seen: _Seen,
                     within: float) -> Answer | None:
        """One look, for a request still waiting for its reply (every second or so), for an
        answer recorded but not relayed (Redis lost the reply, or its holder died right after
        recording it), at a cost that does not grow with the log or the wait.

        While this worker holds the conversation there is nothing to look for: its own holder
        answers the request directly, and a worker that dies loses the request with it.
        Otherwise one small statement says where the conversation's log stands (its latest
        session and next seq); the log is read only when it has moved since the last read and
        then stayed still for a look (an answer is the turn's last write, and a dead holder
        writes nothing after it), so a turn waiting on a slow model costs at most one read,
        and a recorded answer is found within two looks of its recording. The inbox says
        whether another session answered it (``settled``, one row)."""
        if self.conversations.serving(key):
            return None
        mark = await cast("FencedStore", self.registry.store).log_mark(key.tenant, key.label())
        if mark is not None and mark == seen.mark and mark != seen.read:
            seen.read = mark
            answer = await self._recorded_answer(key, mark[0], item_id)
            if answer is not None:
                return answer
        seen.mark = mark
        session = await self.conversations.settled(item_id, within)
        if not session:
            return None
        return await self._recorded_answer(key, session, item_id)

    async def _recorded_answer(self, key: ConversationKey, session: str,
                               item_id: str) -> Answer | None:
        """The answer ``session``'s log records for the item, if its turn has one."""
        found = locate(await self.registry.store.read_log(key.tenant, session), item_id,
                       max_iterations=self.loop.settings.max_iterations)
        if found is None or found.status == "interrupted":
            return None
        if found.status == "apologised":
            return Answer(session, False, found.text or self.loop.settings.apology)
        return Answer(session, True, found.text)

    # -- serving -----------------------------------------------------------------------------

    def _start(self, claim: Claim | None) -> None:
        """Start serving the claimed conversation (no-op without a claim)."""
        if claim is None:
            return
        assert self._group is not None, "use the router as an async context manager"
        worker = self._group.create_task(self._work(claim))
        self.registry.hold(claim.key)  # (before the worker runs) released as it ends
        self._workers[claim.key] = worker

    def channels_started(self) -> None:
        """The channels run: owed conversations may be served now."""
        self._channels.set()

    @property
    def channels_ready(self) -> asyncio.Event:
        """Set once the channels run (what waits to speak first waits for it: schedules)."""
        return self._channels

    async def _adopt(self) -> None:
        """Serve conversations left owed: by the last run (one process) or by a worker that
        went away (several)."""
        await self._channels.wait()
        async for claim in self.conversations.adoptions():
            if self._closing or claim.key in self._workers:
                await self.conversations.release(claim)
            else:
                self._start(claim)

    async def _work(self, claim: Claim) -> None:
        key = claim.key
        me = asyncio.current_task()
        finished = False
        held = True  # by _start
        try:
            async with self.conversations.holding(claim):
                delay = self.retry_delay
                while (item := await self.conversations.next(claim)) is not None:
                    if not held:
                        self.registry.hold(key)
                        held = True
                    async with self.pauses.active(key):
                        served = await self._items.serve(claim, item)
                    if not served:
                        await asyncio.sleep(delay)  # the store is down: the same item again
                        delay = min(delay * 2, MAX_RETRY_DELAY)
                        continue
                    delay = self.retry_delay
                    await self.conversations.done(claim, item)
                    if self.shared:
                        # Not in use while the queue is waited on: a worker keeps its lease a
                        # while for the next message (linger), and a conversation held all
                        # that time could never be closed to keep the open ones within their
                        # memory bound (a worker whose chats each speak within the linger held
                        # them all). Closed meanwhile, the next item opens it from the store
                        # again, as a new claim does (the holder records each item itself).
                        # One process needs no such release: its queue ends when empty, and an
                        # item recorded on receipt must find the copy it was recorded in.
                        self.registry.release(key)
                        held = False
                        if self._closing:
                            break  # hand the rest to the other workers
                else:
                    finished = True  # the claim ended with the queue
        except LeaseLostError as exc:
            log.warning("%s; another worker serves the conversation now", exc)
        except Exception as exc:  # e.g. Redis unreachable: the queue waits for its next holder
            log.error("%s: stopped serving the conversation (%s)", key.label(),
                      type(exc).__name__)
        finally:
            if held:
                self.registry.release(key)
            if self._workers.get(key) is me:
                del self._workers[key]
            if not finished:
                if self.shared:  # what an interrupted turn left in memory is not trusted
                    await self.registry.forget(key, fence=claim.token)
                await self.conversations.release(claim)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in a task of the router's group (a turn's leftover that its
        cancellation must not cut short); dropped when the router has closed."""
        try:
            if self._group is None:
                raise RuntimeError("the router is closed")
            self._group.create_task(work)
        except RuntimeError:
            work.close()

    async def drain(self, grace: float) -> None:
        """Stop taking input; let running turns finish for ``grace`` seconds, then cancel.
        Items not answered by then stay owed (answered after the next start, or by another
        worker)."""
        self._closing = True
        self.conversations.wind_down()  # a lease kept for more is let go, not waited out
        if self._adopter is not None:
            # Cancelled until it has ended: a cancellation landing as a Redis command of the
            # sweep completes is lost on Python 3.11 (gateway.edge.tasks), and the adopter
            # would sweep on for ever while the stop waits for it.
            await stop(self._adopter)
        workers = list(self._workers.values())
        if workers and grace > 0:
            await asyncio.wait(workers, timeout=grace)
        for task in self._workers.values():
            task.cancel()


@dataclass(slots=True)
class _Seen:
    """Where a waiting request's looks found the log (see :meth:`Router._watch`)."""

    mark: tuple[str, int] | None = None
    """The latest session and its next seq at the last look."""
    read: tuple[str, int] | None = None
    """... and when the log was last read."""


def dedup_key(inbound: Inbound) -> str | None:
    """The duplicate check's key: the platform id within its conversation (a web client's
    message ids are its own per conversation; a platform's ids are unique anyway)."""
    if inbound.platform_id is None:
        return None
    return f"{inbound.key.tenant}:{inbound.key.label()}:{inbound.platform_id}"
