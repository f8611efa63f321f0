"""Usage per call and its totals (sessions.usage): whose each call was, what it cost."""

from __future__ import annotations

from typing import Any

import pytest

from sessions import entries
from sessions.pricing import Price, PriceTable
from sessions.records import Outcome
from sessions.replay import replay_bytes
from sessions.usage import CallUsage, aggregate, calls_of, matches_user, total
from tests.sessions.helpers import (
    PROMPT_A,
    assistant,
    call_request,
    sha16,
    tool_result,
    tool_use,
    user,
)

PRICES = PriceTable({"claude-test": Price(3.0, 15.0, 3.75, 0.3)})


def message(msg: dict[str, Any], sender: str | None = None) -> dict[str, Any]:
    return entries.message(msg, {"sender": sender} if sender else None)


def call(n: int, window: tuple[tuple[int, int], ...], model: str = "claude-test",
         ts: str = "2026-11-30T10:00:00.000Z") -> dict[str, Any]:
    body = entries.call(n, call_request(PROMPT_A, window, model=model), None)
    return {**body, "ts": ts}


def outcome(n: int, usage: dict[str, int], cost: float | None = None) -> dict[str, Any]:
    return entries.outcome(Outcome(call=n, usage=usage, cost_usd=cost))


def log(*items: dict[str, Any], tenant: str = "acme", conversation: str = "telegram:7") -> bytes:
    header = {"type": "session", "version": 3, "id": "s1", "startedAt": "t",
              "channel": "telegram", "conversation": conversation, "tenant": tenant}
    prompt = [entries.section(sha16(s.text), s.text) for s in PROMPT_A.sections]
    prompt.append(entries.prompt(PROMPT_A.fingerprint, "initial",
                                 [(s.name, sha16(s.text)) for s in PROMPT_A.sections]))
    lines = [header, *prompt, *items]
    return b"".join(entries.encode_line(item, seq, "2026-11-30T09:00:00.000Z") + b"\n"
                    for seq, item in enumerate(lines))


def test_a_group_turn_is_for_its_sender_tool_rounds_included() -> None:
    """Ada's turn (a tool round: two calls) is hers, though Bob wrote during it; Bob's is his."""
    data = log(
        message(user("hi, time?"), "ada"),                       # 0
        call(0, ((0, 1),)),
        message(tool_use("t1", "clock", {})), outcome(0, {"input_tokens": 100}, 0.0003),  # 1
        message(user("me too"), "bob"),                           # 2 (arrived mid-turn)
        message(tool_result("t1", "12:00")),                      # 3
        call(1, ((0, 2), (3, 4))),
        message(assistant("noon")), outcome(1, {"input_tokens": 120, "output_tokens": 5}),  # 4
        call(2, ((0, 2), (3, 5), (2, 3))),
        message(assistant("hi bob")), outcome(2, {"input_tokens": 130}),
    )
    calls = list(calls_of(replay_bytes(data), PRICES))
    assert [(c.user, c.input_tokens, c.output_tokens) for c in calls] == [
        ("telegram:ada", 100, 0), ("telegram:ada", 120, 5), ("telegram:bob", 130, 0)]
    # Recorded costs stand; unrecorded ones are priced with the table and marked.
    assert [c.cost_usd for c in calls] == [0.0003, pytest.approx((120 * 3 + 5 * 15) / 1e6),
                                           pytest.approx(130 * 3 / 1e6)]
    assert [c.repriced for c in calls] == [False, True, True]
    assert {c.tenant for c in calls} == {"acme"}


def test_unknown_model_counts_tokens_without_cost() -> None:
    """A model no table prices: its tokens count, its cost is unknown (not zero)."""
    data = log(message(user("q"), "ada"), call(0, ((0, 1),), model="llama3"),
               message(assistant("a")), outcome(0, {"input_tokens": 50, "output_tokens": 9}))
    [only] = calls_of(replay_bytes(data), PRICES)
    assert (only.cost_usd, only.repriced) == (None, False)
    [row] = aggregate([only], "model")
    assert (row.key, row.calls, row.tokens, row.cost_usd, row.unpriced) == (
        "llama3", 1, 59, 0.0, 1)


def test_calls_without_outcome_or_sender() -> None:
    """A call with no outcome is not counted; one with no named sender has no person."""
    data = log(message(user("q")), call(0, ((0, 1),)), message(assistant("a")),
               outcome(0, {"input_tokens": 5}), call(1, ((0, 2),)))
    [only] = calls_of(replay_bytes(data), PRICES)
    assert only.user is None
    assert only.key("user") == "acme/(nobody named)"


def usage(user: str | None, model: str, ts: str, cost: float | None, tokens: int,
          conversation: str = "c1", tenant: str = "t") -> CallUsage:
    return CallUsage(tenant=tenant, session="s-" + conversation, channel="web",
                     conversation=conversation, user=user, provider="anthropic", model=model,
                     ts=ts, input_tokens=tokens, cache_write=0, cache_read=tokens,
                     output_tokens=1, cost_usd=cost)


CALLS = [
    usage("web:ada", "m1", "2026-11-29T23:59:00Z", 0.5, 10),
    usage("web:ada", "m2", "2026-11-30T00:01:00Z", None, 20, conversation="c2"),
    usage("web:bob", "m1", "2026-11-30T12:00:00Z", 2.0, 30, tenant="u"),
]


@pytest.mark.parametrize(
    ("by", "expected"),
    [
        ("user", [("u/web:bob", 1, 2.0), ("t/web:ada", 2, 0.5)]),
        ("model", [("m1", 2, 2.5), ("m2", 1, 0.0)]),
        ("tenant", [("u", 1, 2.0), ("t", 2, 0.5)]),
        ("conversation", [("u/c1", 1, 2.0), ("t/c1", 1, 0.5), ("t/c2", 1, 0.0)]),
        ("day", [("2026-11-29", 1, 0.5), ("2026-11-30", 2, 2.0)]),
    ],
)
def test_aggregate_by_each_key(by: Any, expected: list[tuple[str, int, float]]) -> None:
    """Rows add up per key, the costliest first (days in date order)."""
    rows = aggregate(CALLS, by)
    assert [(r.key, r.calls, r.cost_usd) for r in rows] == expected
    whole = total(rows)
    assert (whole.calls, whole.cost_usd, whole.unpriced) == (3, 2.5, 1)
    assert whole.input_total == 2 * (10 + 20 + 30)
    assert len(whole.sessions) == 2


@pytest.mark.parametrize(
    ("wanted", "hit"),
    [(["web:ada"], True), (["ada"], True), (["telegram:ada"], False), (["bob", "ada"], True),
     (["ad"], False)],
)
def test_user_filter(wanted: list[str], hit: bool) -> None:
    """--user matches channel:id or the bare id, exactly."""
    assert matches_user(CALLS[0], wanted) is hit
