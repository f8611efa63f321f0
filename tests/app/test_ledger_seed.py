"""The in-process usage ledger is seeded from today's logs, so a restart does not reset a
person's daily budget."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from app.ledger_seed import seed_from
from coordination.memory_ledger import MemoryLedger
from gateway.edge.ledger import chat_scope_of, day_of, tenant_scope, user_scope
from gateway.usage.limits import LimitSettings
from sessions.jsonl import JsonlSessionStore
from sessions.pricing import Price, PriceTable
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core

NOON = datetime(2026, 6, 15, 12, 0, tzinfo=UTC).timestamp()
"""The test's one moment: the calls' entries, the ledger's day and the budget check share it
(on the wall clock, calls recorded before a UTC midnight were not today's after it)."""


def clock() -> float:
    return NOON


async def test_a_restart_keeps_todays_usage_and_its_budget(tmp_path: Path) -> None:
    """Two answered turns before a restart; after it the seed counts them (scopes, tokens,
    cost priced now) and the person's 4-token budget refuses the next message."""
    store_dir = tmp_path / "d"
    prices = PriceTable({"scripted": Price(1_000_000.0, 1_000_000.0, 0.0, 0.0)})
    first = ScriptedProvider()
    async with running_core(JsonlSessionStore(store_dir, clock=clock), first, tmp_path / "p",
                            ledger=MemoryLedger(), clock=clock) as core:
        for n in range(2):
            await core.channel.say("c1", f"hello {n}", sender="ada")
            await core.channel.wait_replies(n + 1)
    store = JsonlSessionStore(store_dir, clock=clock)
    seeded = MemoryLedger(seed_from(store, prices))
    day = day_of(NOON)
    ada = await seeded.spent(user_scope("default", "memory", "ada"), day)
    assert (ada.calls, ada.tokens, ada.cost_usd) == (2, 4, 4.0)  # 1 + 1 tokens a call, $1 each
    assert await seeded.spent(tenant_scope("default"), day) == ada
    assert await seeded.spent(chat_scope_of("default", "memory:c1"), day) == ada
    again = ScriptedProvider()
    async with running_core(JsonlSessionStore(store_dir, clock=clock), again, tmp_path / "p",
                            ledger=MemoryLedger(seed_from(store, prices)),
                            budgets=LimitSettings(user_tokens=4), clock=clock) as core:
        await core.channel.say("c1", "one more", sender="ada")
        [(_, _, text)] = await core.channel.wait_replies(1)
    assert text.startswith("You've used up today's allowance")
    assert again.bodies == []
