"""What each provider call used and cost: counted as it happens, for ``/metrics``, outcomes,
budgets and ``/usage``.

:class:`Accounting` prices a call's usage with the price table in force
(:mod:`sessions.pricing`; an unknown model has no cost, never a guessed one), counts tokens and
dollars by provider, model and tenant, and adds them to the usage ledger
(:mod:`gateway.edge.ledger`) for the tenant, the chat and the person. The loop records the cost in
the call's ``outcome`` entry, so ``gateway usage`` and the viewer report what each call cost
when it was made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.edge.ledger import UsageLedger, day_of, scopes_of
from gateway.edge.messages import ChannelContext, ConversationKey
from gateway.edge.metrics import Metrics, tenant_label
from sessions.pricing import PriceTable, total_tokens

TOKEN_KINDS = (
    ("input_tokens", "input"),
    ("cache_creation_input_tokens", "cache_write"),
    ("cache_read_input_tokens", "cache_read"),
    ("output_tokens", "output"),
)
"""Usage keys and the ``kind`` label their tokens are counted under."""


class Accounting:
    """Prices calls and counts their tokens and cost. Shared by every conversation."""

    def __init__(self, metrics: Metrics, prices: PriceTable | None = None,
                 ledger: UsageLedger | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.metrics = metrics
        self.prices = prices or PriceTable()
        self.ledger = ledger
        self.clock = clock

    async def charge(self, *, key: ConversationKey, context: ChannelContext, provider: str,
                     model: str, usage: Mapping[str, Any]) -> float | None:
        """Count one answered call's tokens and cost; return the cost (None: model unknown)."""
        tenant = tenant_label(key.tenant, key.channel)
        for field, kind in TOKEN_KINDS:
            value = usage.get(field)
            if isinstance(value, int) and value > 0:
                self.metrics.tokens.labels(provider=provider, model=model, tenant=tenant,
                                           kind=kind).inc(value)
        cost = self.prices.cost(model, usage)
        if cost:
            self.metrics.cost.labels(provider=provider, model=model, tenant=tenant).inc(cost)
        if self.ledger is not None:
            await self.ledger.add(scopes_of(key, context), day_of(self.clock()),
                                  total_tokens(usage), cost or 0.0)
        return cost
