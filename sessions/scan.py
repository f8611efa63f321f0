"""Cheap one-pass scans of a log's bytes: recover writer state, summarise for listings.

Both tolerate a torn last line and skip corrupt lines (replay is where corruption is reported).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessions.encoding import loads_entry
from sessions.store import SessionState


def split_lines(data: bytes) -> tuple[list[bytes], bool]:
    """Complete lines of ``data`` and whether a torn (unterminated) last line was dropped."""
    lines = data.split(b"\n")
    tail = lines.pop()  # "" when data ends with a newline
    return lines, bool(tail)


def _loads(line: bytes) -> dict[str, Any] | None:
    return loads_entry(line)


def recover_state(lines: list[bytes]) -> SessionState:
    """The writer state a resumed session continues from."""
    state = SessionState()
    for raw in lines:
        entry = _loads(raw)
        if entry is None:
            continue
        kind = entry.get("type")
        seq = entry.get("seq")
        if isinstance(seq, int) and seq >= state.next_seq:
            state.next_seq = seq + 1
        if kind == "message":
            state.message_count += 1
        elif kind == "section" and isinstance(entry.get("hash"), str):
            state.sections.add(entry["hash"])
        elif kind == "prompt" and isinstance(entry.get("fingerprint"), str):
            state.last_prompt = entry["fingerprint"]
        elif kind == "tools" and isinstance(entry.get("fingerprint"), str):
            state.tool_sets.add(entry["fingerprint"])
        elif kind == "call":
            index = entry.get("call")
            if isinstance(index, int) and index >= state.call_count:
                state.call_count = index + 1
            tools = entry.get("tools")
            state.last_tools = tools if isinstance(tools, str) else None
    return state


@dataclass(frozen=True, slots=True)
class Summary:
    header: dict[str, Any] | None
    message_count: int
    first_user_text: str | None
    torn: bool
    scheduled: int = 0


def summarise(data: bytes) -> Summary:
    """Header, message count and first user text, for ``--list`` and the viewer's index."""
    lines, torn = split_lines(data)
    header = _loads(lines[0]) if lines else None
    if header is not None and header.get("type") != "session":
        header = None
    count = scheduled = 0
    first: str | None = None
    for raw in lines[1:]:
        # Cheap pre-filter: only message lines need parsing for a listing.
        if b'"message"' not in raw:
            continue
        entry = _loads(raw)
        if entry is None or entry.get("type") != "message":
            continue
        count += 1
        if SCHEDULED_MARK in raw and _scheduled(entry):
            scheduled += 1
        if first is None:
            msg = entry.get("message")
            if isinstance(msg, dict) and msg.get("role") == "user":
                first = message_text(msg.get("content"))
    return Summary(header=header, message_count=count, first_user_text=first, torn=torn,
                   scheduled=scheduled)


SCHEDULED_MARK = b'"scheduled":{"schedule":'
"""How a scheduled turn's message reads in its line (its ``meta``); a cheap pre-filter, the
entry itself is checked."""


def _scheduled(entry: dict[str, Any]) -> bool:
    meta = entry.get("meta")
    msg = entry.get("message")
    return (isinstance(meta, dict) and isinstance(meta.get("scheduled"), dict)
            and isinstance(msg, dict) and msg.get("role") == "user")


def message_text(content: Any) -> str | None:
    """The readable text of a message's content (text blocks only), or None if it has none."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        ]
        return "".join(parts) if parts else None
    return None
