"""The erasure seams: how an erasure reaches whoever holds a person's conversations.

An erasure (``gateway forget``, ``/forget``) must not delete a log a turn is writing, nor
leave a copy of it cached where the next turn would carry it on. So before anything is
deleted, every process that serves conversations holds those of the person's channel still
(:class:`Holder`): it waits until none is in a turn or being received, and starts none until
the erasure is over; afterwards it drops its copies of the sessions the erasure changed, and
the next message opens them from the store again (a fresh session where theirs was deleted).

Several workers are reached through an :class:`ErasureBus` (Redis pub/sub,
:mod:`coordination.redis_erasure`): the process that runs the erasure asks every other worker
to hold still and waits for each to confirm, or gives up, having changed nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from gateway.edge.messages import ConversationKey


class ErasureRefusedError(Exception):
    """The erasure could not go ahead (a conversation stayed busy, a worker did not confirm,
    a session is open elsewhere); nothing was changed. The message says why."""


@dataclass(frozen=True, slots=True)
class Hold:
    """What a hold covers: the conversations of one channel of one tenant. ``exempt``: a
    conversation already serving the erasure itself (``/forget``), not waited for."""

    tenant: str
    channel: str
    exempt: ConversationKey | None = None

    def covers(self, key: ConversationKey) -> bool:
        return key.tenant == self.tenant and key.channel == self.channel


class Holder(Protocol):
    """A process's conversations, held still for an erasure.

    Contract: entering :meth:`holding` waits (at most ``timeout`` seconds, else
    :class:`ErasureRefusedError`, nothing held) until no conversation the hold covers is in a
    turn or being received, but the exempt one; until exit, none starts one (deliveries and
    turns wait). :meth:`drop` closes the copies of these sessions it has open, so the next
    turn reads them from the store. Exit releases the hold, also on an error."""

    def holding(self, hold: Hold, timeout: float) -> AbstractAsyncContextManager[None]: ...

    async def drop(self, sessions: Collection[str]) -> int: ...


@dataclass(slots=True)
class Changed:
    """What an erasure changed, filled in before the bus's hold ends: the other workers drop
    their copies of these sessions as they let go, and empty the stderr logs they keep of
    the MCP servers in ``mcp_servers`` (a worker's own data folder may differ from the
    erasing process's). ``elsewhere`` is filled in as the hold ends: what the other workers
    removed of their own (``"<kind> <worker>:<name>"``), and a line for each that did not
    say in time."""

    sessions: set[str] = field(default_factory=set)
    mcp_servers: set[str] = field(default_factory=set)
    elsewhere: list[str] = field(default_factory=list)


OwnErasure = Callable[[Collection[str]], Awaitable[list[str]]]
"""What a worker erases of its own for an erasure another process ran: given the MCP servers
whose stderr logs go, it empties its copies and returns their names."""


class ErasureBus(Protocol):
    """Reaches the other workers (see the module docstring).

    Contract: entering :meth:`others` asks every other worker to hold ``hold`` still and
    waits until each confirms (:class:`ErasureRefusedError` if one refuses or does not answer
    within ``timeout`` seconds: those that held let go, nothing changed); exit tells them to
    drop ``Changed.sessions``, to empty their logs of ``Changed.mcp_servers`` (when there are
    any, exit waits, at most ``timeout``, for each to say what it emptied:
    ``Changed.elsewhere``) and to let go (they also let go by themselves if that never comes).
    :meth:`serve` answers the other workers' requests with this worker's ``holder`` (and
    ``own``, what it erases of its own) until cancelled; it sets ``started`` once requests
    published from then on reach it."""

    def others(self, hold: Hold, timeout: float) -> AbstractAsyncContextManager[Changed]: ...

    async def serve(self, holder: Holder, started: asyncio.Event | None = None,
                    own: OwnErasure | None = None) -> None: ...
