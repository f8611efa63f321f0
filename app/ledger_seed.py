"""What the session logs already recorded today, to seed the in-process usage ledger.

One gateway process keeps its usage totals in memory (``coordination.memory_ledger``); after a
restart they would start at zero and a person over their daily budget could start again. So on
its first use of a day the ledger asks this seed: every call recorded that UTC day, from the
sessions written since midnight, with the scopes it counts for (tenant, chat, person), its
tokens and its cost (recorded, or priced now). Replay runs in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime

from gateway.edge.ledger import Seed, SeedEntry, chat_scope_of, tenant_scope, user_scope
from sessions.errors import SessionError
from sessions.pricing import PriceTable
from sessions.replay import replay_bytes
from sessions.store import SessionStore
from sessions.usage import CallUsage, calls_of


def seed_from(store: SessionStore, prices: PriceTable) -> Seed:
    """The seed of a ledger over ``store``'s logs."""

    async def seed(day: str) -> Iterable[SeedEntry]:
        start = datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp()
        found: list[SeedEntry] = []
        for info in await store.list_sessions(None):
            if info.modified < start:
                continue  # nothing in it was written today
            try:
                data = await store.read_log(info.tenant, info.session_id)
                calls = await asyncio.to_thread(_calls, data, prices, day)
            except (SessionError, OSError):
                continue  # unreadable or pruned meanwhile: replay reports those elsewhere
            found += [_entry(call) for call in calls]
        return found

    return seed


def _calls(data: bytes, prices: PriceTable, day: str) -> list[CallUsage]:
    return [c for c in calls_of(replay_bytes(data), prices) if c.ts and c.ts.startswith(day)]


def _entry(call: CallUsage) -> SeedEntry:
    scopes = [tenant_scope(call.tenant), chat_scope_of(call.tenant, call.conversation)]
    if call.user:
        channel, _, person = call.user.partition(":")
        scopes.append(user_scope(call.tenant, channel, person))
    tokens = call.input_tokens + call.cache_write + call.cache_read + call.output_tokens
    return scopes, tokens, call.cost_usd or 0.0
