"""Budgets and rate limits, checked before a turn's first provider call (all off by default).

Per person and per tenant, a daily budget of tokens or of US dollars (UTC days, from the usage
ledger: :mod:`gateway.edge.ledger`), and a per-person message rate (so many messages in so many
seconds). Over a limit, the person gets one polite sentence that says when they can continue,
nothing reaches the provider, and the refusal is recorded in the session (a ``refusal``
entry) and counted (``gateway_limited_total``). The message itself stays recorded, as every
acknowledged message is: the next turn's window will show it to the model.

Daily totals are read before the turn and counted after each call, so a turn that starts under
a budget may end a little over it: a budget is a guard against runaway use, not an invoice.

A scheduled turn (``ChannelContext.scheduled_by``) is no message anyone sent: the message rate
leaves it alone (``GATEWAY_SCHEDULE_PER_MINUTE`` paces those), and a person's budget applies
to it only when that person set it (an operator's schedule is limited by the tenant's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gateway.edge.ledger import (
    UsageLedger,
    day_of,
    tenant_scope,
    user_scope,
)
from gateway.edge.messages import ChannelContext, ConversationKey


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """0 turns a limit off."""

    user_tokens: int = 0
    user_usd: float = 0.0
    tenant_tokens: int = 0
    tenant_usd: float = 0.0
    user_messages: int = 0
    """Messages a person may send in ``user_window`` seconds."""
    user_window: float = 60.0

    @property
    def any(self) -> bool:
        return bool(self.user_tokens or self.user_usd or self.tenant_tokens or self.tenant_usd
                    or self.user_messages)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a turn is refused: ``limit`` names it (for the log and the metric), ``until`` is
    when the person can continue (Unix time), ``text`` what they are told."""

    limit: str
    until: float
    text: str


class Limits:
    """Checks the limits of one turn. Shared by every conversation."""

    def __init__(self, settings: LimitSettings, ledger: UsageLedger) -> None:
        self.settings = settings
        self.ledger = ledger

    async def check(self, key: ConversationKey, context: ChannelContext,
                    now: float) -> Refusal | None:
        """The refusal of a turn about to start at ``now``, or None to go ahead. A turn that
        goes ahead counts toward the person's message rate."""
        s = self.settings
        if not s.any:
            return None
        day = day_of(now)
        midnight = _next_midnight(now)
        person = user_scope(key.tenant, key.channel, context.person) if context.person else None
        scheduled = context.scheduled_by
        if scheduled is not None and scheduled != f"person:{key.channel}:{context.person}":
            person = None  # an operator's schedule: nobody's allowance but the tenant's
        if s.tenant_tokens or s.tenant_usd:
            spent = await self.ledger.spent(tenant_scope(key.tenant), day)
            if (s.tenant_tokens and spent.tokens >= s.tenant_tokens) or (
                    s.tenant_usd and spent.cost_usd >= s.tenant_usd):
                return Refusal("tenant_budget", midnight,
                               "This workspace has used up today's allowance for me, so I "
                               f"can't answer until {_when(midnight, now)}. Sorry!")
        if person is not None and (s.user_tokens or s.user_usd):
            spent = await self.ledger.spent(person, day)
            if (s.user_tokens and spent.tokens >= s.user_tokens) or (
                    s.user_usd and spent.cost_usd >= s.user_usd):
                return Refusal("user_budget", midnight,
                               "You've used up today's allowance, so I can't answer until "
                               f"{_when(midnight, now)}. Thanks for understanding!")
        if person is not None and s.user_messages and scheduled is None:
            wait = await self.ledger.hit(person, now, s.user_messages, s.user_window)
            if wait > 0:
                until = now + wait
                return Refusal("user_rate", until,
                               "You're sending messages faster than I can keep up with: please "
                               f"wait {_seconds(wait)} and try again.")
        return None


def iso_time(moment: float) -> str:
    """A Unix time as the log writes times: UTC, milliseconds, ``Z``."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _next_midnight(now: float) -> float:
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (today + timedelta(days=1)).timestamp()


def _when(until: float, now: float) -> str:
    """``midnight UTC (in 3 h 20 min)``: when budgets reset, and how long that is."""
    left = max(0, int(until - now))
    hours, minutes = divmod(math.ceil(left / 60), 60)
    span = f"{hours} h {minutes} min" if hours else f"{minutes} min"
    return f"midnight UTC (in {span})"


def _seconds(wait: float) -> str:
    seconds = max(1, math.ceil(wait))
    if seconds < 90:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    return f"{math.ceil(seconds / 60)} minutes"
