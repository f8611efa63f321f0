"""Token usage and cost per call, and totals by conversation, person, tenant, model or day. Pure.

One :class:`CallUsage` per provider call that has an ``outcome`` entry. Its cost is the one
recorded when the call was made (``cost_usd``); a call recorded without one (an older log, or
a model the table did not know then) is priced with the table given, if it knows the model,
and marked ``repriced``. A call nobody can price counts its tokens and is ``unpriced``.

The person a call is for is the sender of the message its window ends on, walking back over
tool results: the inbound message the turn answers (windows follow conversation order, so a
message that arrived during the turn from someone else is not it). Calls whose window names
no sender (a v1/v2 log, a rerun) have no person.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sessions.pricing import PriceTable
from sessions.replay import Call, Replay

By = Literal["conversation", "user", "tenant", "model", "day", "session"]
BY: tuple[By, ...] = ("conversation", "user", "tenant", "model", "day", "session")


@dataclass(frozen=True, slots=True)
class CallUsage:
    """One call's usage, with whose it was."""

    tenant: str
    session: str
    channel: str
    conversation: str
    user: str | None
    """``channel:sender id`` of the person the call answered, when the log names one."""
    provider: str
    model: str
    ts: str | None
    input_tokens: int
    cache_write: int
    cache_read: int
    output_tokens: int
    cost_usd: float | None
    repriced: bool = False

    @property
    def day(self) -> str:
        return self.ts[:10] if self.ts else "unknown"

    def key(self, by: By) -> str:
        if by == "conversation":
            return f"{self.tenant}/{self.conversation}"
        if by == "user":
            return f"{self.tenant}/{self.user or '(nobody named)'}"
        if by == "tenant":
            return self.tenant
        if by == "model":
            return self.model
        if by == "session":
            return f"{self.tenant}/{self.session}"
        return self.day


@dataclass(slots=True)
class UsageRow:
    """Totals of the calls that share one key."""

    key: str
    calls: int = 0
    input_tokens: int = 0
    cache_write: int = 0
    cache_read: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    unpriced: int = 0
    """Calls without a cost (their model is in no price table): their tokens count, no cost."""
    sessions: set[str] = field(default_factory=set)

    def add(self, call: CallUsage) -> None:
        self.calls += 1
        self.input_tokens += call.input_tokens
        self.cache_write += call.cache_write
        self.cache_read += call.cache_read
        self.output_tokens += call.output_tokens
        if call.cost_usd is None:
            self.unpriced += 1
        else:
            self.cost_usd += call.cost_usd
        self.sessions.add(call.session)

    @property
    def input_total(self) -> int:
        """Every input token: uncached, written to and read from the cache."""
        return self.input_tokens + self.cache_write + self.cache_read

    @property
    def tokens(self) -> int:
        return self.input_total + self.output_tokens

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "calls": self.calls, "sessions": len(self.sessions),
                "input_tokens": self.input_tokens, "cache_write_tokens": self.cache_write,
                "cache_read_tokens": self.cache_read, "output_tokens": self.output_tokens,
                "cost_usd": round(self.cost_usd, 6), "unpriced_calls": self.unpriced}


def calls_of(replay: Replay, prices: PriceTable | None = None) -> Iterator[CallUsage]:
    """The usage of every call of ``replay`` that has an outcome."""
    header = replay.header
    tenant = str(header.get("tenant") or "default")
    channel = str(header.get("channel") or "")
    conversation = str(header.get("conversation") or "")
    for call in replay.calls:
        outcome = replay.outcome_of(call)
        if outcome is None:
            continue
        usage = outcome.usage or {}
        model = call.model or str(header.get("model") or "")
        cost, repriced = outcome.cost_usd, False
        if cost is None and prices is not None and usage:
            cost = prices.cost(model, usage)
            repriced = cost is not None
        yield CallUsage(
            tenant=tenant, session=replay.session_id, channel=channel,
            conversation=conversation, user=sender_of(replay, call, channel),
            provider=call.provider or "", model=model, ts=call.ts,
            input_tokens=_count(usage, "input_tokens"),
            cache_write=_count(usage, "cache_creation_input_tokens"),
            cache_read=_count(usage, "cache_read_input_tokens"),
            output_tokens=_count(usage, "output_tokens"),
            cost_usd=cost, repriced=repriced,
        )


def sender_of(replay: Replay, call: Call, channel: str) -> str | None:
    """``channel:sender`` of the message ``call``'s window ends on (see the module doc)."""
    if not call.window:
        return None
    messages = replay.messages
    for start, end in reversed(call.window):
        for index in range(min(end, len(messages)) - 1, start - 1, -1):
            meta = messages.entry(index).get("meta")
            sender = meta.get("sender") if isinstance(meta, dict) else None
            if isinstance(sender, str) and sender:
                return f"{channel}:{sender}"
    return None


def aggregate(calls: Iterable[CallUsage], by: By) -> list[UsageRow]:
    """Totals per key, most expensive first (then most tokens, then by key)."""
    rows: dict[str, UsageRow] = {}
    for call in calls:
        key = call.key(by)
        row = rows.get(key)
        if row is None:
            row = rows[key] = UsageRow(key)
        row.add(call)
    if by == "day":
        return sorted(rows.values(), key=lambda r: r.key)
    return sorted(rows.values(), key=lambda r: (-r.cost_usd, -r.tokens, r.key))


def total(rows: Sequence[UsageRow]) -> UsageRow:
    """One row adding up ``rows``."""
    out = UsageRow("total")
    for row in rows:
        out.calls += row.calls
        out.input_tokens += row.input_tokens
        out.cache_write += row.cache_write
        out.cache_read += row.cache_read
        out.output_tokens += row.output_tokens
        out.cost_usd += row.cost_usd
        out.unpriced += row.unpriced
        out.sessions |= row.sessions
    return out


def matches_user(call: CallUsage, wanted: Sequence[str]) -> bool:
    """Whether the call's person is one of ``wanted`` (``channel:id`` or a bare id)."""
    if call.user is None:
        return False
    bare = call.user.split(":", 1)[-1]
    return any(w in (call.user, bare) for w in wanted)


def _count(usage: Any, key: str) -> int:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
