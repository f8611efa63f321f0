"""One trace per turn: the ids of a turn's spans, derived from the log, and its calls. Pure.

A *turn* answers one inbound message; its provider calls and tool calls are its spans. The live
tracer (``app/telemetry.py``) and ``gateway export --format otlp-json``
(:mod:`sessions.otlp_export`) give them the same ids, computed here from facts both know:

* the trace and the turn's span: the tenant, the session and the turn, named by the index of
  the message it answers (the call entry's ``inbound``, which the agent loop records);
* a call's span: the number of its ``call`` entry;
* a tool call's span: the number of the call whose answer asked for it, and its tool-use id.

Each id is a prefix of a sha256 over these, tagged with what it names, so the same log always
gives the same ids, and an operator can join a live trace to its exported record (or a log
line, which carries ``trace_id`` and ``span_id`` while a turn runs).

Logs written before calls recorded ``inbound`` have their turns inferred (:func:`turns_of`):
a call answers the last message of its window that a person wrote (walking back over tool
results), a fallback attempt belongs to the turn of the call it follows, and a compaction call
to the turn of the call after it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sessions.replay import Call, Refused, Replay

TurnKey = int | str
"""The index of the message a turn answers; a string (``call:N``) for a call of an old log
whose turn cannot be told."""


def _hex(tag: str, parts: tuple[object, ...], size: int) -> str:
    digest = hashlib.sha256("\0".join([tag, *map(str, parts)]).encode()).hexdigest()[:size]
    # An all-zero id is invalid in OpenTelemetry; sha256 gives one once in 2**64 or more.
    return digest if digest.strip("0") else digest[:-1] + "1"


def trace_id(tenant: str, session: str, turn: TurnKey) -> str:
    """32 hex characters: the trace of one turn."""
    return _hex("trace", (tenant, session, turn), 32)


def turn_span_id(tenant: str, session: str, turn: TurnKey) -> str:
    """16 hex characters: the turn's own (root) span."""
    return _hex("turn", (tenant, session, turn), 16)


def call_span_id(tenant: str, session: str, call: int | str) -> str:
    """16 hex characters: the span of the call recorded as ``call`` entry number ``call``."""
    return _hex("call", (tenant, session, call), 16)


def tool_span_id(tenant: str, session: str, call: int | str, tool_use_id: str) -> str:
    """16 hex characters: a tool call of the answer of ``call``, by its tool-use id."""
    return _hex("tool", (tenant, session, call, tool_use_id), 16)


def call_key(call: Call) -> int | str:
    """What a call's span id is derived from: its call entry's number, or (a call the log has
    no entry for, never seen live under that id) its place in the replay."""
    return call.entry_number if call.entry_number is not None else f"replay:{call.index}"


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of a log: the message it answers and the calls it made, in order; or a turn a
    budget or rate limit refused before any call (``refusal``)."""

    key: TurnKey
    calls: tuple[Call, ...] = ()
    refusal: Refused | None = None


def turns_of(replay: Replay) -> list[Turn]:
    """Every turn of ``replay`` that made a call or was refused, in the order they began."""
    keys: dict[int, TurnKey] = {}  # replay call index -> its turn
    by_entry = {c.entry_number: c for c in replay.calls if c.entry_number is not None}
    waiting: list[Call] = []  # compaction calls, until the call they made room for
    for call in replay.calls:
        if call.lineage is not None and call.lineage.reason == "compaction" \
                and call.inbound is None:
            waiting.append(call)
            continue
        key = _key_of(replay, call, by_entry, keys)
        keys[call.index] = key
        for earlier in waiting:
            keys[earlier.index] = key
        waiting.clear()
    for call in waiting:  # a compaction with no call after it (the turn stopped there)
        keys[call.index] = _key_of(replay, call, by_entry, keys)
    grouped: dict[TurnKey, list[Call]] = {}
    for call in replay.calls:
        grouped.setdefault(keys[call.index], []).append(call)
    turns = [Turn(key, tuple(calls)) for key, calls in grouped.items()]
    for refusal in replay.refusals:
        if refusal.after > 0 and refusal.after - 1 not in grouped:
            turns.append(Turn(refusal.after - 1, refusal=refusal))
    first = {turn.key: (turn.calls[0].line if turn.calls else _line(turn)) for turn in turns}
    return sorted(turns, key=lambda turn: first[turn.key])


def _line(turn: Turn) -> int:
    assert turn.refusal is not None
    return turn.refusal.line


def _key_of(replay: Replay, call: Call, by_entry: Mapping[int, Call],
            keys: Mapping[int, TurnKey]) -> TurnKey:
    if call.inbound is not None:
        return call.inbound
    after = call.lineage.after if call.lineage is not None else None
    if after is not None and after in by_entry and by_entry[after].index in keys:
        return keys[by_entry[after].index]
    found = _last_person_message(replay, call)
    return found if found is not None else f"call:{call_key(call)}"


def _last_person_message(replay: Replay, call: Call) -> int | None:
    """The last message of the call's window that a person wrote (not only tool results)."""
    for start, end in reversed(call.window or ()):
        for index in range(min(end, len(replay.messages)) - 1, start - 1, -1):
            message = replay.messages[index]
            if message.get("role") == "user" and not _only_results(message.get("content")):
                return index
    return None


def _only_results(content: Any) -> bool:
    return isinstance(content, list) and bool(content) and all(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
