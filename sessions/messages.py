"""Reading the conversation back out of a log: its messages, and where one inbound item is.

The registry resumes a conversation from :func:`read_messages`; a takeover (another worker,
or this process after a restart) finds how far an owed item's turn got with
:func:`find_item`. Both read the log's bytes as any store returns them (``read_log``), skip
corrupt lines and a torn tail like every scan, and are the only places outside the store
that know how message entries look.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from sessions.encoding import loads_entry
from sessions.records import MessageDict
from sessions.scan import split_lines


def _entries(data: bytes) -> list[dict[str, Any]]:
    lines, _ = split_lines(data)
    out: list[dict[str, Any]] = []
    for raw in lines[1:]:
        entry = loads_entry(raw)  # escaped bodies unfolded, as written
        if entry is not None:
            out.append(entry)
    return out


@dataclass(frozen=True, slots=True)
class Logged:
    """A session's conversation as its log holds it.

    ``messages`` in log order; ``last_ts`` the timestamp of the last one; ``unstarted`` the
    indices of people's messages no recorded call has seen yet: received (recorded on
    receipt) but their turn never began, e.g. queued when the gateway stopped. They join the
    conversation when their turn starts, not where the log has them.
    """

    messages: list[MessageDict]
    last_ts: str | None
    unstarted: frozenset[int]


def read_messages(data: bytes) -> Logged:
    """The conversation in the log ``data`` (see :class:`Logged`)."""
    out: list[MessageDict] = []
    last_ts: str | None = None
    people: list[int] = []
    seen: list[tuple[int, int]] = []  # window ranges of every call
    for entry in _entries(data):
        kind = entry.get("type")
        msg = entry.get("message")
        if kind == "message" and isinstance(msg, dict):
            if _plain_user(msg):
                people.append(len(out))
            out.append(msg)  # a message entry's body, as written
            ts = entry.get("ts")
            last_ts = ts if isinstance(ts, str) else last_ts
        elif kind == "call":
            seen.extend(_ranges(entry))
    covered = _merge(seen)
    starts = [a for a, _ in covered]
    unstarted = frozenset(i for i in people if not _covers(covered, starts, i))
    return Logged(out, last_ts, unstarted)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _covers(merged: list[tuple[int, int]], starts: list[int], index: int) -> bool:
    at = bisect_right(starts, index) - 1
    return at >= 0 and merged[at][0] <= index < merged[at][1]


def _ranges(entry: dict[str, Any]) -> list[tuple[int, int]]:
    window = entry.get("window")
    if not isinstance(window, list):
        return []
    return [(r[0], r[1]) for r in window if isinstance(r, list) and len(r) == 2
            and isinstance(r[0], int) and isinstance(r[1], int)]


@dataclass(frozen=True, slots=True)
class ItemTrace:
    """An inbound item's message in the log, and what its turn recorded.

    ``index`` is its message index. ``after`` holds its turn's messages (answers and tool
    results, in log order) and ``failed`` says whether one of its turn's calls ended with an
    error outcome (the turn apologised). A turn starts with the first ``call`` entry whose
    window ends at the item's message (the newest message of the conversation when its turn
    began); from there every answer and tool-result message of the session belongs to it, since
    a conversation runs one turn at a time. Plain user messages in between are other items,
    recorded on receipt while this turn ran. No such call: the turn never started.
    """

    index: int
    after: tuple[MessageDict, ...]
    failed: bool


def find_item(data: bytes, item_id: str) -> ItemTrace | None:
    """The turn of the message recorded with ``meta.item == item_id``, or ``None`` if there
    is no such message."""
    index = -1
    at: int | None = None
    ours: set[int] = set()  # the item's message and its turn's tool results
    calls: set[int] = set()
    after: list[MessageDict] = []
    expect: str | None = None  # "answer" after one of its calls, "results" after a tool use
    failed = False
    for entry in _entries(data):
        kind = entry.get("type")
        if kind == "message" and isinstance(entry.get("message"), dict):
            index += 1
            message = entry["message"]
            if at is None:
                if _item_of(entry) == item_id:
                    at = index
                    ours.add(index)
            elif expect == "answer" and message.get("role") == "assistant":
                after.append(message)
                if not _uses_tools(message):
                    break  # its final answer: what follows is later turns'
                expect = "results"
            elif expect == "results" and not _plain_user(message):
                after.append(message)
                ours.add(index)
                expect = None
        elif at is None:
            continue
        elif kind == "call" and _window_end(entry) in ours:
            if isinstance(entry.get("call"), int):
                calls.add(entry["call"])
            expect = "answer"
        elif kind == "outcome" and entry.get("error") and entry.get("call") in calls:
            failed = True
            break  # the turn ended with an apology
    if at is None:
        return None
    return ItemTrace(at, tuple(after), failed)


def _window_end(entry: dict[str, Any]) -> int | None:
    """The last message index a call's window covers (its newest, in conversation order)."""
    window = entry.get("window")
    if isinstance(window, list) and window:
        last = window[-1]
        if isinstance(last, list) and len(last) == 2 and isinstance(last[1], int):
            return last[1] - 1
    return None


def _plain_user(message: dict[str, Any]) -> bool:
    """A person's message (not tool results): another item, not part of a running turn."""
    if message.get("role") != "user":
        return False
    content = message.get("content")
    return not (isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content))


def _uses_tools(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_use" for b in content)


def _item_of(entry: dict[str, Any]) -> object:
    meta = entry.get("meta")
    return meta.get("item") if isinstance(meta, dict) else None
