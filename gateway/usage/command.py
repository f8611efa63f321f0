"""``/usage``: what this person and this chat used today, and how much of their allowance.

A chat command (:mod:`gateway.edge.commands`) answered from the usage ledger
(:mod:`gateway.edge.ledger`): the person who asks sees their own totals and the conversation's,
never anyone else's. Days are UTC, as budgets are.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.edge.commands import CommandCall
from gateway.edge.ledger import Spent, UsageLedger, chat_scope, day_of, tenant_scope, user_scope
from gateway.usage.limits import LimitSettings


class UsageCommand:
    """The handler of ``/usage``."""

    def __init__(self, ledger: UsageLedger, limits: LimitSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.ledger = ledger
        self.limits = limits
        self.clock = clock

    async def run(self, call: CommandCall) -> str:
        key, context = call.inbound.key, call.context
        day = day_of(self.clock())
        lines = [f"Usage today ({day}, UTC):"]
        if context.person:
            mine = await self.ledger.spent(user_scope(key.tenant, key.channel, context.person),
                                           day)
            lines.append(f"- you: {_spent(mine)}")
            lines += _allowance("your daily allowance", mine, self.limits.user_tokens,
                                self.limits.user_usd)
        chat = await self.ledger.spent(chat_scope(key), day)
        lines.append(f"- this chat: {_spent(chat)}")
        if self.limits.tenant_tokens or self.limits.tenant_usd:
            whole = await self.ledger.spent(tenant_scope(key.tenant), day)
            lines += _allowance("this workspace's daily allowance", whole,
                                self.limits.tenant_tokens, self.limits.tenant_usd)
        if self.limits.user_messages:
            lines.append(f"- at most {self.limits.user_messages} messages every "
                         f"{self.limits.user_window:g} seconds per person")
        return "\n".join(lines)


def _spent(spent: Spent) -> str:
    if not spent.calls:
        return "nothing yet"
    calls = f"{spent.calls} model call{'s' if spent.calls != 1 else ''}"
    return f"{calls}, {spent.tokens:,} tokens, ${spent.cost_usd:.4f}"


def _allowance(label: str, spent: Spent, tokens: int, usd: float) -> list[str]:
    lines = []
    if tokens:
        lines.append(f"- {label}: {tokens:,} tokens ({min(100, spent.tokens * 100 // tokens)}% "
                     "used)")
    if usd:
        lines.append(f"- {label}: ${usd:.2f} ({min(100, int(spent.cost_usd * 100 / usd))}% used)")
    return lines
