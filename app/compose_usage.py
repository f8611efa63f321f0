"""The composition root, usage half: where usage totals are kept and the limits on them.

The usage ledger (in the workers' shared Redis, else in this process seeded from today's
logs) and the budgets and rate limit of ``GATEWAY_BUDGET_*`` and ``GATEWAY_RATE_LIMIT_*``.
Kept apart from :mod:`app.compose_loop`: the ledger is also read by the scheduler and the
``/usage`` command, not only by the turn's limits.
"""

from __future__ import annotations

from app.config import Settings
from app.ledger_seed import seed_from
from app.prices import load_prices
from coordination.memory_ledger import MemoryLedger
from gateway.edge.ledger import UsageLedger
from gateway.usage.limits import LimitSettings
from sessions.store import SessionStore


def limit_settings(settings: Settings) -> LimitSettings:
    """Budgets and the rate limit from ``GATEWAY_BUDGET_*`` and ``GATEWAY_RATE_LIMIT_*``."""
    return LimitSettings(
        user_tokens=settings.budget_user_tokens, user_usd=settings.budget_user_usd,
        tenant_tokens=settings.budget_tenant_tokens, tenant_usd=settings.budget_tenant_usd,
        user_messages=settings.rate_limit_messages, user_window=settings.rate_limit_seconds)


def build_ledger(settings: Settings, store: SessionStore) -> UsageLedger:
    """Usage totals in the workers' Redis when they share one, else in this process (seeded
    from today's logs on first use, so a restart does not reset a budget)."""
    if settings.redis_url is not None:
        from coordination.redis_ledger import KEEP_DAYS, RedisLedger
        from sessions.retention import keep_seconds

        policy = settings.retention
        return RedisLedger(settings.redis_url.get_secret_value(), settings.redis_prefix,
                           keep=lambda tenant: keep_seconds(policy, tenant, KEEP_DAYS))
    return MemoryLedger(seed_from(store, load_prices(settings.prices_file)))
