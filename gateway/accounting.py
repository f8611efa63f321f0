"""What each provider call used and cost: counted as it happens, for ``/metrics`` and outcomes.

:class:`Accounting` prices a call's usage with the price table in force
(:mod:`sessions.pricing`; an unknown model has no cost, never a guessed one) and counts tokens
and dollars by provider, model and tenant. The loop records the cost in the call's ``outcome``
entry, so ``gateway usage`` and the viewer report what each call cost when it was made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.metrics import Metrics
from sessions.pricing import PriceTable

TOKEN_KINDS = (
    ("input_tokens", "input"),
    ("cache_creation_input_tokens", "cache_write"),
    ("cache_read_input_tokens", "cache_read"),
    ("output_tokens", "output"),
)
"""Usage keys and the ``kind`` label their tokens are counted under."""


class Accounting:
    """Prices calls and counts their tokens and cost. Shared by every conversation."""

    def __init__(self, metrics: Metrics, prices: PriceTable | None = None) -> None:
        self.metrics = metrics
        self.prices = prices or PriceTable()

    def charge(self, *, tenant: str, provider: str, model: str,
               usage: Mapping[str, Any]) -> float | None:
        """Count one answered call's tokens and cost; return the cost (None: model unknown)."""
        for key, kind in TOKEN_KINDS:
            value = usage.get(key)
            if isinstance(value, int) and value > 0:
                self.metrics.tokens.labels(provider=provider, model=model, tenant=tenant,
                                           kind=kind).inc(value)
        cost = self.prices.cost(model, usage)
        if cost:
            self.metrics.cost.labels(provider=provider, model=model, tenant=tenant).inc(cost)
        return cost
