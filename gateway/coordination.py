"""The coordination seam: who serves a conversation, and what workers share.

:class:`Coordinator` is the one object the composition root picks: in-process (one gateway,
:mod:`coordination.local`) or Redis (several workers, ``GATEWAY_REDIS_URL``,
:mod:`coordination.redis_coordinator`). It hands out the smaller seams below to the
parts that need them: the router gets a :class:`ConversationQueue` and a deduplicator, the
polling channels a :class:`LeaderElector`, access control a pairing state.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Self

from gateway.channel import ReplySink
from gateway.dedup import Deduplicator
from gateway.messages import ConversationKey, Inbound
from gateway.pairing import PairingState
from sessions.store import SessionWriter

ItemKind = Literal["message", "new", "command"]
"""A person's message, ``/new`` (start a fresh session once the queued turns are done), or
another chat command (:mod:`gateway.commands`: answered, never recorded)."""


def new_item_id() -> str:
    return secrets.token_hex(8)


class LeaseLostError(Exception):
    """This worker no longer holds a conversation's lease (it lapsed or was taken over)."""


@dataclass(slots=True)
class QueueItem:
    """One inbound message waiting for, or in, its conversation's turn.

    ``index`` is where it was recorded in the session when the receiver recorded it on
    receipt; ``None`` when the conversation's lease holder records it as its turn starts.
    ``sink`` is where the reply goes; ``None``: the channel's own sink for the inbound.
    ``resumed`` is set by a shared queue for an item an earlier holder had started when it
    died: it may already be recorded, or even answered, and must not be recorded twice.
    """

    inbound: Inbound
    sink: ReplySink | None = None
    index: int | None = None
    kind: ItemKind = "message"
    id: str = field(default_factory=new_item_id)
    resumed: bool = False


@dataclass(slots=True)
class Claim:
    """The right to serve one conversation now (its lease).

    ``token`` is the lease's fencing token, given to the session store so that a holder whose
    lease lapsed cannot append any more; ``None`` in one process (nothing to fence).
    """

    key: ConversationKey
    token: int | None = None


@dataclass(frozen=True, slots=True)
class Ticket:
    """What :meth:`ConversationQueue.submit` says: a duplicate, or queued (and maybe claimed)."""

    duplicate: bool = False
    claim: Claim | None = None


class ConversationQueue(Protocol):
    """Per-conversation queues in arrival order, each served by one worker at a time.

    Contract: :meth:`submit` appends an item to its conversation's queue and returns a
    :class:`Claim` when the caller must serve that conversation now (nobody was serving it);
    otherwise the current server will reach the item. The server loops :meth:`next` /
    :meth:`done` inside :meth:`holding`: ``next`` returns the oldest unfinished item (the same
    one again until it is ``done``) or ``None`` once the queue is empty, and at that moment
    the claim is gone, atomically, so a later submit claims anew and no item is stranded.
    :meth:`release` gives the claim up early (shutdown, errors; idempotent): items left are
    served by whoever claims the conversation next. Conversations left with items and no
    server (their worker died) come back through :meth:`adoptions`.

    ``records_on_receipt`` is True when this process is the only writer of every session, so
    the router records a message in its session as it arrives; False when only the
    conversation's holder may write, so messages are recorded as their turn starts.
    """

    records_on_receipt: bool

    @property
    def queued(self) -> int:
        """Items accepted by this worker that have not reached their turn yet."""
        ...

    async def submit(self, item: QueueItem, dedup_key: str | None = None) -> Ticket:
        """Queue ``item``; with ``dedup_key``, atomically refuse it if that key was seen."""
        ...

    async def next(self, claim: Claim) -> QueueItem | None: ...

    async def done(self, claim: Claim, item: QueueItem) -> None: ...

    def holding(self, claim: Claim) -> AbstractAsyncContextManager[None]:
        """Keep the claim alive while the block runs; :class:`LeaseLostError` if it is lost."""
        ...

    async def release(self, claim: Claim) -> None: ...

    async def refence(self, claim: Claim, at_least: int) -> None:
        """Raise the claim's token to at least ``at_least`` (a store holds a higher one)."""
        ...

    async def recorded(self, item: QueueItem, session_id: str) -> None:
        """Tell the item's receiver that it is recorded (it may be waiting to answer)."""
        ...

    async def wait_recorded(self, item: QueueItem, within: float) -> str | None:
        """The session ``item`` was recorded in; ``None`` after ``within`` seconds without."""
        ...

    def adoptions(self) -> AsyncIterator[Claim]:
        """Claims on conversations whose server went away with items left (never ends)."""
        ...


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

    @property
    def dedup(self) -> Deduplicator:
        """The router's duplicate check (platform ids), shared by all workers."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def aclose(self) -> None: ...

    def deduplicator(self, namespace: str, ttl: float) -> Deduplicator | None:
        """A shared deduplicator for a channel's own ids; ``None``: keep the channel's file."""
        ...

    def elector(self, name: str) -> LeaderElector | None:
        """The election for singleton job ``name``; ``None``: this process is the only one."""
        ...

    def pairing_state(self) -> PairingState | None:
        """Shared pairing state; ``None``: the file under the data directory."""
        ...

    def health(self) -> Mapping[str, Any]: ...
