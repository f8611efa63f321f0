"""The coordination seam: who serves a conversation, and what workers share.

:class:`Coordinator` is the one object the composition root picks: in-process (one gateway,
:mod:`coordination.local`) or Redis (several workers, ``GATEWAY_REDIS_URL``,
:mod:`coordination.redis_coordinator`). It hands out the smaller seams below to the
parts that need them: the router gets a :class:`ConversationQueue` (which also drops
duplicate deliveries: the one dedup step), the polling channels a :class:`LeaderElector`,
access control a pairing state.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Self

from gateway.edge.channel import ReplySink
from gateway.edge.erasure import ErasureBus
from gateway.edge.messages import ConversationKey, Inbound
from gateway.edge.pairing import PairingState
from sessions.store import SessionWriter

ItemKind = Literal["message", "new", "command"]
"""A person's message, ``/new`` (start a fresh session once the queued turns are done), or
another chat command (:mod:`gateway.edge.commands`: answered, never recorded)."""


_ids = random.Random(secrets.randbits(128))
# A forked child must not draw the parent's ids (the module-level random is reseeded by
# Python itself; this generator is not).
os.register_at_fork(after_in_child=lambda: _ids.seed(secrets.randbits(128)))


def new_item_id() -> str:
    """16 hex digits, unique across processes and restarts (64 random bits). Not a secret:
    ids are in logs and the journal, so a generator seeded from the OS serves, without a
    system call for every message received."""
    return f"{_ids.getrandbits(64):016x}"


class LeaseLostError(Exception):
    """This worker no longer holds a conversation's lease (it lapsed or was taken over)."""


@dataclass(slots=True)
class QueueItem:
    """One inbound message waiting for, or in, its conversation's turn.

    ``index`` is where it was recorded in the session (``session``) when the receiver recorded
    it on receipt; ``None`` when it is recorded as its turn starts. ``sink`` is where the reply
    goes; ``None``: the channel's own sink for the inbound, opened when the turn starts.
    ``resumed`` is set for an item an earlier holder (or an earlier run of this process) may
    have started: it may already be recorded, or even answered, and must not be recorded or
    answered twice (see :mod:`gateway.delivery.takeover`).
    """

    inbound: Inbound
    sink: ReplySink | None = None
    index: int | None = None
    kind: ItemKind = "message"
    id: str = field(default_factory=new_item_id)
    resumed: bool = False
    session: str | None = None


@dataclass(slots=True)
class Claim:
    """The right to serve one conversation now (its lease).

    ``token`` is the lease's fencing token, given to the session store so that a holder whose
    lease lapsed cannot append any more; ``None`` in one process (nothing to fence).
    ``lease`` is the coordinator's mark of this claim on the lease (Redis: the lease key's
    value, the worker's id and a number of its own), so a release, a renewal or a check by
    this claim touches only the lease it took, never one a later claim of the same worker
    took after it lapsed; ``None`` in one process, and once released.
    """

    key: ConversationKey
    token: int | None = None
    lease: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Entered:
    """What :meth:`ConversationQueue.enter` says: claimed anew, or a duplicate.

    For a duplicate, ``original`` is the item id of the delivery that was recorded, and
    ``session_id`` the session it was recorded in (when known).
    """

    duplicate: bool = False
    original: str | None = None
    session_id: str | None = None


class ConversationQueue(Protocol):
    """The durable record of what is owed an answer, and per-conversation queues over it.

    Receiving is an explicit claim that is kept or released: :meth:`enter` durably records the
    item as *owed* (a duplicate platform id is refused atomically: the one dedup step), or
    raises :class:`~gateway.edge.errors.UnavailableError` when it cannot record it. The receiver
    then
    :meth:`keep` s it (queued for its turn; a :class:`Claim` comes back when the caller must
    serve the conversation now) or, when it could not finish receiving it, :meth:`withdraw` s
    it (the platform will deliver it again). A second :meth:`enter` of the same platform id
    while the first is neither kept nor withdrawn waits for that outcome.

    The server loops :meth:`next` / :meth:`done` inside :meth:`holding`: ``next`` returns the
    oldest item not yet answered (the same one again until it is ``done``) or ``None`` once the
    queue is empty, and at that moment the claim is gone, atomically, so a later ``keep``
    claims anew and no item is stranded. ``done`` marks the item answered, durably: an item
    never ``done`` is served again by the next holder (after a crash: on the next start),
    marked ``resumed``. :meth:`release` gives the claim up early (shutdown, errors; idempotent):
    items left are served by whoever claims the conversation next. It releases only the lease
    that claim holds: the worker may have claimed the conversation again since (the lease
    lapsed or Redis lost it while the old holder wound up), and that claim's lease stays.
    Conversations left with items and no server (their worker died, or this process
    restarted) come back through :meth:`adoptions`.

    ``records_on_receipt`` is True when this process is the only writer of every session, so
    the router records a message in its session as it arrives (unless its files are still to
    be fetched); False when only the
    conversation's holder may write, so messages are recorded as their turn starts.
    """

    records_on_receipt: bool

    @property
    def queued(self) -> int:
        """Items accepted by this worker that have not reached their turn yet."""
        ...

    async def enter(self, item: QueueItem, dedup_key: str | None = None) -> Entered: ...

    async def keep(self, item: QueueItem) -> Claim | None: ...

    async def withdraw(self, item: QueueItem) -> None: ...

    async def next(self, claim: Claim) -> QueueItem | None: ...

    async def done(self, claim: Claim, item: QueueItem) -> None:
        """The item is answered (idempotent): called the moment its reply went out, and
        again when its turn is over."""
        ...

    def holding(self, claim: Claim) -> AbstractAsyncContextManager[None]:
        """Keep the claim alive while the block runs; :class:`LeaseLostError` if it is lost
        (the block is cancelled, reliably, as soon as the lease may have lapsed)."""
        ...

    def check(self, claim: Claim) -> None:
        """Raise :class:`LeaseLostError` if the claim's lease may have lapsed by now (a cheap
        local check: the last gate before a provider call)."""
        ...

    async def confirm(self, claim: Claim) -> None:
        """Raise :class:`LeaseLostError` unless the claim's lease is still held, asked at its
        source (Redis), not only of the local deadline: the gate before a reply no log entry
        fences (the apology after an unexpected failure). One process: nothing to ask."""
        ...

    async def release(self, claim: Claim) -> None: ...

    async def refence(self, claim: Claim, at_least: int) -> None:
        """Raise the claim's token to at least ``at_least`` (a store holds a higher one),
        after confirming the lease is still this worker's: :class:`LeaseLostError` when it
        has passed on (then the newer token is the new holder's, and must stay ahead)."""
        ...

    def serving(self, key: ConversationKey) -> bool:
        """True while this worker holds the conversation (its replies go straight to the
        requests waiting here, never through Redis)."""
        ...

    def wind_down(self) -> None:
        """The worker is stopping: a holder waiting for its conversation's next message
        (a lease kept a moment) lets go now, and none waits from now on."""
        ...

    def records_later(self, key: ConversationKey) -> bool:
        """True while an item queued in the conversation and not served yet must be recorded
        before a message received now, which then waits to be recorded as its turn starts: a
        ``/new`` (the message belongs to the new session), or a message whose files are still
        to fetch (:func:`gateway.edge.messages.deferred`; recorded as its own turn starts), so the
        session keeps the order messages came in."""
        ...

    async def recorded(self, item: QueueItem, session_id: str) -> None:
        """Tell the item's receiver that it is recorded (it may be waiting to answer)."""
        ...

    def on_recorded(self, item: QueueItem) -> asyncio.Future[str] | None:
        """A future that gets the session id once ``item`` is recorded, wherever it is
        served (``None``: nobody here can be told). Call before :meth:`enter`."""
        ...

    async def settled(self, item_id: str, within: float) -> str | None:
        """The session an item was answered in, waiting up to ``within`` seconds for its
        answer; ``None`` if it is not answered by then (or unknown)."""
        ...

    def adoptions(self) -> AsyncIterator[Claim]:
        """Claims on conversations whose server went away with items left (never ends)."""
        ...

    async def erase(self, tenant: str, sessions: Collection[str],
                    items: Collection[str], dry: bool = False) -> int:
        """Forget what is kept of an erased person's answered items (answered in one of
        ``sessions``, or one of ``items``): their text and platform ids, durably, now (the owed
        journal is rewritten without their lines; their inbox rows are deleted). Items still
        owed stay. Returns how many lines or rows went (``dry``: would go, nothing changes);
        raises ``OSError`` if it cannot."""
        ...


LeaseCheck = Callable[[], None]
"""The lease check of the claim a turn serves (:meth:`ConversationQueue.check` bound to it),
passed from the serving of the claimed item into the turn and run by the caller as the last
step before each provider call: it raises :class:`LeaseLostError` when the lease may have
lapsed (a pause, a partition), so the holder stops before the call."""


class SeenDelivery(Protocol):
    """An earlier delivery of a platform id (see :meth:`SharedInbox.enter`)."""

    @property
    def item(self) -> str: ...

    @property
    def session_id(self) -> str | None: ...

    @property
    def answered(self) -> bool: ...


class OwedHead(Protocol):
    """The head of a conversation's queue as one holder takes it."""

    @property
    def item(self) -> str: ...

    @property
    def body(self) -> str: ...

    @property
    def attempts(self) -> int:
        """How many holders have taken it (more than one: an earlier one may have started
        it)."""
        ...

    @property
    def fence(self) -> int | None:
        """A fresh fencing token drawn with it (``head(..., fenced=True)``), else ``None``."""
        ...


class SharedInbox(Protocol):
    """The durable record of what workers owe (``sessions.postgres.inbox``): it lives with
    the sessions, so a coordinator that loses its state (Redis) loses nothing acknowledged.

    Contract: :meth:`enter` commits the item before it returns, or refuses it as a duplicate
    of an earlier delivery with the same ``dedup`` key, atomically; :meth:`head` returns the
    oldest unanswered item of a conversation (the same one until it is :meth:`answered`);
    :meth:`owed_conversations` lists conversations with unanswered items, reading only those;
    :meth:`next_fence` hands out fencing tokens that never repeat or go back. Every method
    raises an ``OSError`` when the database cannot be reached.
    """

    async def enter(self, tenant: str, conversation: str, item: str, dedup: str | None,
                    body: str) -> SeenDelivery | None: ...

    async def head(self, tenant: str, conversation: str, *,
                   fenced: bool = False) -> OwedHead | None:
        """The oldest unanswered item (``fenced``: with a fresh token, as :meth:`next_fence`
        gives, drawn in the same round trip; none is drawn when the queue is empty)."""
        ...

    async def answered(self, item: str, session_id: str | None) -> None: ...

    async def answered_then_head(self, item: str, session_id: str | None, tenant: str,
                                 conversation: str) -> OwedHead | None:
        """:meth:`answered`, then :meth:`head` of ``conversation``, atomically (one statement:
        the answer that ends a turn reads the queue for the next)."""
        ...

    async def owed_conversations(self, limit: int = 10_000) -> list[tuple[str, str]]: ...

    async def has_owed(self, tenant: str, conversation: str) -> bool: ...

    async def status(self, item: str) -> tuple[bool, str | None] | None: ...

    async def prune(self, older_than: float) -> int: ...

    async def erase(self, tenant: str, sessions: Collection[str],
                    items: Collection[str], dry: bool = False) -> int:
        """Delete the answered rows of ``items`` or answered in ``sessions``; how many
        (``dry``: only count them)."""
        ...

    async def next_fence(self, at_least: int = 0) -> int: ...


class LeaderElector(Protocol):
    """One leader among the workers for a singleton job (a bot's long poll, a socket).

    Contract: :meth:`lead` waits until this worker is elected, runs ``job`` while it stays
    leader, cancels ``job`` as soon as leadership may be lost (before the lease lapses on the
    shared clock, so two leaders never overlap), then campaigns again. It returns only when
    cancelled, and then gives leadership up.
    """

    @property
    def is_leader(self) -> bool: ...

    async def lead(self, job: Callable[[], Awaitable[None]]) -> None: ...


class FencedStore(Protocol):
    """A session store whose writers carry a fencing token (``sessions.postgres.store``).

    ``open(..., fence=N)`` makes every writer with a lower token stale, and raises
    :class:`~sessions.errors.StaleWriterError` when the session already holds a higher one.
    """

    async def create(self, *, tenant: str, channel: str, conversation: str,
                     fence: int | None = None,
                     extra: Mapping[str, Any] | None = None) -> SessionWriter: ...

    async def open(self, tenant: str, session_id: str,
                   fence: int | None = None) -> SessionWriter: ...

    async def log_mark(self, tenant: str, conversation: str) -> tuple[str, int] | None:
        """Where the conversation's log stands: its latest session and that session's next
        seq (one small read), ``None`` when it has none."""
        ...

    async def refence(self, tenant: str, session_id: str, fence: int, *,
                      latest_of: str | None = None) -> int | None:
        """Move the session on to the newer token ``fence`` without reading it; its
        ``next_seq`` (``StaleWriterError`` when it holds a newer token). ``latest_of``: only
        if it is still that conversation's latest session, else ``None``, unchanged."""
        ...


class FencedWriter(Protocol):
    """A writer whose session was moved on to a newer token for the same holder."""

    @property
    def fenced_off(self) -> bool:
        """True once an append was refused as stale: the writer's state counts entries the log
        never got, so the conversation must be read again, not refenced."""
        ...

    def refenced(self, fence: int) -> None: ...


def supports_fencing(store: object) -> bool:
    """True for a store that takes fencing tokens (checked once, at composition)."""
    import inspect

    opener = getattr(store, "open", None)
    try:
        return opener is not None and "fence" in inspect.signature(opener).parameters
    except (TypeError, ValueError):
        return False


class Coordinator(Protocol):
    """Everything workers share. An async context manager; :meth:`aclose` is idempotent."""

    @property
    def conversations(self) -> ConversationQueue: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def aclose(self) -> None: ...

    def elector(self, name: str) -> LeaderElector | None:
        """The election for singleton job ``name``; ``None``: this process is the only one."""
        ...

    def erasure_bus(self) -> ErasureBus | None:
        """How an erasure reaches the other workers (``None``: there are none)."""
        ...

    def pairing_state(self) -> PairingState | None:
        """Shared pairing state; ``None``: the file under the data directory."""
        ...

    def health(self) -> Mapping[str, Any]: ...
