"""Total encoding: every value JSON can decode to is recorded exactly, never skipped."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest

from sessions import entries
from sessions.encoding import ESCAPED, dumps, loads_entry, unescape
from sessions.replay import replay_bytes

ODD: list[tuple[str, Any]] = [
    ("int past 64 bits", 2**70),
    ("negative int past 64 bits", -(2**100) - 7),
    ("NaN", math.nan),
    ("Infinity", math.inf),
    ("-Infinity", -math.inf),
    ("lone high surrogate", "a\ud800b"),
    ("lone low surrogate", "\udfff"),
    ("half an emoji", "smile \ud83d"),
]


def same(a: Any, b: Any) -> bool:
    """Exact equality, NaN included (json text of both, with types kept: 1 is not 1.0)."""
    return json.dumps(a, allow_nan=True) == json.dumps(b, allow_nan=True)


@pytest.mark.parametrize(("name", "value"), ODD, ids=[n for n, _ in ODD])
def test_odd_values_round_trip_exactly_in_the_escaped_form(name: str, value: Any) -> None:
    """A message holding a value orjson cannot take exactly is escaped and read back exact."""
    message = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"v": value, "n": [1, value]}}]}
    line = entries.encode_line(entries.message(message), 7, "2026-01-01T00:00:00.000Z")
    raw = orjson.loads(line)  # still one standard JSON object: any JSON reader can skip it
    assert list(raw) == ["type", "seq", "ts", ESCAPED]
    assert (raw["type"], raw["seq"]) == ("message", 7)
    entry = loads_entry(line)
    assert entry is not None
    assert same(entry["message"], message)


def test_ordinary_entries_keep_orjsons_bytes() -> None:
    """Entries the fast path takes exactly are written as orjson writes them (format unchanged),
    a legitimate null included."""
    item = {"type": "call", "call": 0, "tools": None, "params": {"temperature": 0.5}}
    line = entries.encode_line(item, 3, "T")
    assert line == orjson.dumps({"type": "call", "seq": 3, "ts": "T", "call": 0, "tools": None,
                                 "params": {"temperature": 0.5}})
    assert loads_entry(line) == orjson.loads(line)


def test_escaped_entries_replay_and_unknown_objects_are_kept_as_text() -> None:
    """A whole log with escaped lines replays with exact messages; a non-JSON object inside an
    entry is kept as its type and repr rather than dropping the entry."""
    head = entries.header("s", "T", tenant="default", channel="web", conversation="c")
    user = {"role": "user", "content": "big \ud800"}
    odd = {"type": "outcome", "call": 0, "usage": {"weird": {1, 2}}}
    data = b"".join(entries.encode_line(item, seq, "T") + b"\n" for seq, item in
                    enumerate([head, entries.message(user), odd]))
    replay = replay_bytes(data)
    assert replay.problems == ()
    assert same(list(replay.messages), [user])
    outcome = loads_entry(data.splitlines()[2])
    assert outcome is not None
    assert outcome["usage"] == {"weird": {"$unencodable": "set", "repr": "{1, 2}"}}


def test_a_broken_escaped_body_is_left_for_replay_to_report() -> None:
    """An escaped body that does not parse is not guessed at: the entry stays as it is."""
    entry = {"type": "message", "seq": 1, "ts": "T", ESCAPED: "{not json"}
    assert unescape(entry) is entry
    head = entries.encode_line(
        entries.header("s", "T", tenant="default", channel="web", conversation="c"), 0, "T")
    replay = replay_bytes(head + b"\n" + orjson.dumps(entry) + b"\n")
    assert [p.message for p in replay.problems] == ["message entry without a valid role/content"]


@pytest.mark.parametrize(("name", "value"), ODD, ids=[n for n, _ in ODD])
def test_dumps_for_people_is_exact_and_ascii(name: str, value: Any) -> None:
    """Output for the CLI and the viewer: exact (Python reads it back), and encodable."""
    text = dumps({"v": value}, indent=True)
    assert same(json.loads(text), {"v": value})
    text.decode("ascii")
