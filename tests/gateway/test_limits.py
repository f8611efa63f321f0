"""Budgets and rate limits: refused before any provider call with one sentence saying when to
come back, the refusal recorded and counted; /usage shows a person their own usage."""

from __future__ import annotations

import dataclasses
import io
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from app.admin.session_pages import notices
from app.commands.replay import print_summary
from coordination.memory_ledger import MemoryLedger
from gateway.edge.ledger import day_of, tenant_scope, user_scope
from gateway.edge.messages import ChannelContext, ConversationKey
from gateway.usage.limits import Limits, LimitSettings
from sessions.jsonl import JsonlSessionStore
from sessions.replay import replay_bytes
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core

KEY = ConversationKey("telegram", "42", "acme")
ADA = ChannelContext("telegram", "private", "Ada", tenant="acme", chat="42", person="7")
NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()


async def spend(ledger: MemoryLedger, scopes: list[str], tokens: int, cost: float) -> None:
    await ledger.add(scopes, day_of(NOON), tokens, cost)


@pytest.mark.parametrize(
    ("settings", "scopes", "tokens", "cost", "limit"),
    [
        (LimitSettings(user_tokens=1000), ["u"], 1000, 0.0, "user_budget"),
        (LimitSettings(user_usd=0.5), ["u"], 10, 0.5, "user_budget"),
        (LimitSettings(tenant_tokens=5000), ["t"], 5000, 0.0, "tenant_budget"),
        (LimitSettings(tenant_usd=2.0), ["t"], 10, 2.5, "tenant_budget"),
    ],
)
async def test_a_spent_budget_refuses_until_midnight_utc(
    settings: LimitSettings, scopes: list[str], tokens: int, cost: float, limit: str,
) -> None:
    """At the budget, the turn is refused until midnight UTC, and the sentence says when."""
    ledger = MemoryLedger()
    real = {"u": user_scope("acme", "telegram", "7"), "t": tenant_scope("acme")}
    await spend(ledger, [real[s] for s in scopes], tokens - 1, cost / 2)
    limits = Limits(settings, ledger)
    assert await limits.check(KEY, ADA, NOON) is None  # just under
    await spend(ledger, [real[s] for s in scopes], 1, cost / 2)
    refusal = await limits.check(KEY, ADA, NOON)
    assert refusal is not None
    assert refusal.limit == limit
    assert refusal.until == datetime(2026, 12, 2, tzinfo=UTC).timestamp()
    assert refusal.text.endswith(("(in 12 h 0 min). Sorry!",
                                  "(in 12 h 0 min). Thanks for understanding!"))
    # Someone else (or, for a user budget, another person) goes ahead.
    bob = ChannelContext("telegram", "private", "Bob", tenant="acme", chat="43", person="8")
    other = await limits.check(ConversationKey("telegram", "43", "acme"), bob, NOON)
    assert (other is None) == (limit == "user_budget")


async def test_rate_limit_says_how_long_to_wait() -> None:
    """Three messages a minute: the fourth waits until the first leaves the minute."""
    limits = Limits(LimitSettings(user_messages=3, user_window=60), MemoryLedger())
    assert [await limits.check(KEY, ADA, NOON + t) for t in (0, 5, 10)] == [None] * 3
    refusal = await limits.check(KEY, ADA, NOON + 20)
    assert refusal is not None
    assert (refusal.limit, refusal.until) == ("user_rate", NOON + 60)
    assert refusal.text == ("You're sending messages faster than I can keep up with: please "
                            "wait 40 seconds and try again.")
    assert await limits.check(KEY, ADA, NOON + 61) is None


async def test_a_scheduled_turn_spends_the_allowance_of_the_person_who_set_it_only() -> None:
    """Ada's budget spent: her own reminder is refused like her messages; an operator's
    message to her DM is not hers to pay (the tenant's budget limits those)."""
    ledger = MemoryLedger()
    await spend(ledger, [user_scope("acme", "telegram", "7")], 1000, 0.0)
    limits = Limits(LimitSettings(user_tokens=1000), ledger)
    hers = dataclasses.replace(ADA, scheduled_by="person:telegram:7")
    operators = dataclasses.replace(ADA, scheduled_by="operator")
    refusal = await limits.check(KEY, hers, NOON)
    assert refusal is not None
    assert refusal.limit == "user_budget"
    assert await limits.check(KEY, operators, NOON) is None


async def test_nothing_set_checks_nothing() -> None:
    """Off by default: no limit, no ledger read, no message counted."""
    assert await Limits(LimitSettings(), MemoryLedger()).check(KEY, ADA, NOON) is None


async def test_a_refused_turn_reaches_no_provider_and_is_recorded(tmp_path: Path) -> None:
    """Over a 1-token daily budget, the second message is answered by the refusal alone: no
    provider call, a refusal entry in the log, the counter; the message itself is kept."""
    provider = ScriptedProvider()
    ledger = MemoryLedger()
    # One day for the whole test: on the wall clock, a first call counted just before a UTC
    # midnight left the next day's budget untouched, and the second message went through.
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            ledger=ledger, budgets=LimitSettings(user_tokens=1),
                            clock=lambda: NOON) as core:
        accepted = await core.channel.say("c1", "hello")
        await core.channel.wait_replies(1)
        await core.channel.say("c1", "and again")
        replies = await core.channel.wait_replies(2)
        metrics = core.metrics.render().decode()
        assert accepted is not None
        data = await core.store.read_log("default", accepted.session_id or "")
    assert replies[1][2].startswith("You've used up today's allowance")
    assert len(provider.bodies) == 1
    entries = [orjson.loads(line) for line in data.splitlines()]
    [refusal] = [e for e in entries if e["type"] == "refusal"]
    assert refusal["limit"] == "user_budget"
    assert refusal["until"] == "2026-12-02T00:00:00.000Z"
    texts = [e["message"]["content"] for e in entries if e["type"] == "message"]
    assert texts[-1] == "and again"
    assert 'gateway_limited_total{limit="user_budget",tenant="default"} 1.0' in metrics
    # Replay, its summary and the viewer say which message was refused, and that no call was.
    replay = replay_bytes(data)
    [refused] = replay.refusals
    assert (refused.limit, refused.until, refused.after) == ("user_budget", refusal["until"], 3)
    assert len(replay.calls) == 1
    out = io.StringIO()
    print_summary(replay, out)
    assert (f"message 3 got the user_budget limit's notice (until {refusal['until']}), no "
            "provider call") in out.getvalue()
    assert "message 3 got the user_budget limit" in str(notices(replay))


async def test_usage_command_shows_your_own_and_this_chat(tmp_path: Path) -> None:
    """/usage answers with the person's and the chat's totals (and the allowance), records
    nothing, and never shows another person's."""
    provider = ScriptedProvider()
    # Pinned: on the wall clock, calls counted before a UTC midnight and /usage asked after it
    # answered "nothing yet".
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            ledger=MemoryLedger(), budgets=LimitSettings(user_tokens=1000),
                            clock=lambda: NOON) as core:
        await core.channel.say("c1", "hello", sender="ada")
        await core.channel.wait_replies(1)
        await core.channel.say("c2", "hi", sender="bob")
        await core.channel.wait_replies(2)
        await core.channel.say("c1", "/usage", sender="ada")
        replies = await core.channel.wait_replies(3)
    answer = replies[2][2].splitlines()
    assert answer == ["Usage today (2026-12-01, UTC):",
                      "- you: 1 model call, 2 tokens, $0.0000",
                      "- your daily allowance: 1,000 tokens (0% used)",
                      "- this chat: 1 model call, 2 tokens, $0.0000"]
    assert len(provider.bodies) == 2  # the command reached no provider
