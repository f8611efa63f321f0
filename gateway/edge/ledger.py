"""The usage ledger seam: running totals of what people, chats and tenants spent today, and
their message rate, shared by every worker.

Budgets (:mod:`gateway.usage.limits`) read it before a turn's first call, ``/usage`` reads it to
tell
people what they used, and :class:`gateway.usage.accounting.Accounting` adds every answered call.
Totals are kept per scope and UTC day; a scope names whose they are (STYLE rule 14)::

    user:<tenant>:<channel>:<person id>     one person (their platform id in that channel)
    chat:<tenant>:<conversation label>      one conversation (a group counts as one)
    tenant:<tenant>                         a whole tenant (a Slack workspace, say)

Backends: in-process (``coordination.memory_ledger``: one gateway, seeded from today's logs at
start) and Redis (``coordination.redis_ledger``: every worker's calls in one place).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from gateway.edge.messages import ChannelContext, ConversationKey


@dataclass(frozen=True, slots=True)
class Spent:
    """What one scope used on one day."""

    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


NOTHING = Spent()


def user_scope(tenant: str, channel: str, person: str) -> str:
    return f"user:{tenant}:{channel}:{person}"


def chat_scope(key: ConversationKey) -> str:
    return chat_scope_of(key.tenant, key.label())


def chat_scope_of(tenant: str, conversation: str) -> str:
    """The chat scope of a conversation label (``ConversationKey.label()``, as headers keep it)."""
    return f"chat:{tenant}:{conversation}"


def tenant_scope(tenant: str) -> str:
    return f"tenant:{tenant}"


def scopes_of(key: ConversationKey, context: ChannelContext) -> list[str]:
    """Every scope a call of this conversation counts for (the person when known)."""
    scopes = [tenant_scope(key.tenant), chat_scope(key)]
    if context.person:
        scopes.append(user_scope(key.tenant, key.channel, context.person))
    return scopes


def tenant_of(scope: str) -> str:
    """The tenant a scope belongs to (every scope names it second)."""
    return scope.split(":", 2)[1] if scope.count(":") >= 1 else scope


def day_of(moment: float) -> str:
    """The UTC day (``YYYY-MM-DD``) a Unix time falls on: budgets reset at midnight UTC."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d")


SeedEntry = tuple[Sequence[str], int, float]
"""One recorded call: the scopes it counts for, its tokens and its cost."""
Seed = Callable[[str], Awaitable[Iterable[SeedEntry]]]
"""What was already recorded on a UTC day (``YYYY-MM-DD``), for a ledger that keeps its totals
in memory and starts empty after a restart."""


class UsageLedger(Protocol):
    """Totals per scope and UTC day, and per-person message rates.

    Contract: :meth:`add` counts one answered call for each scope (never raises for a backend
    outage: the call already happened; it logs and drops the count); :meth:`spent` returns the
    totals counted so far (``NOTHING`` when none, or when the backend cannot be read: a
    budget then lets the message through rather than refuse everyone); :meth:`hit` counts one
    message of ``scope`` at ``now`` when fewer than ``limit`` were counted in the last
    ``window`` seconds and returns 0, else counts nothing and returns the seconds until the
    oldest of them leaves the window. :meth:`aclose` is idempotent.
    """

    async def add(self, scopes: Sequence[str], day: str, tokens: int, cost_usd: float) -> None:
        ...

    async def spent(self, scope: str, day: str) -> Spent: ...

    async def hit(self, scope: str, now: float, limit: int, window: float) -> float: ...

    async def aclose(self) -> None: ...
