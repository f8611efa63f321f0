"""The latest compaction summary of a log, for a conversation that resumes it. Pure.

A compaction call is a ``call`` entry with ``"reason": "compaction"`` and the messages it
summarises (``replaces``); its summary is the ``answer`` of its ``outcome`` entry. A session
resumed after a restart sends the latest one again instead of those messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessions.encoding import loads_entry
from sessions.records import Lineage, Window
from sessions.scan import message_text, split_lines


@dataclass(frozen=True, slots=True)
class LoggedSummary:
    call: int
    text: str
    replaces: Window


def latest_summary(data: bytes) -> LoggedSummary | None:
    """The summary of the log's last answered compaction call, if any."""
    lines, _ = split_lines(data)
    replaced: dict[int, Window] = {}
    found: LoggedSummary | None = None
    for raw in lines[1:]:
        if b'"compaction"' in raw:
            entry = loads_entry(raw)
            if entry is None or entry.get("type") != "call":
                continue
            lineage = Lineage.from_json(entry)
            call = entry.get("call")
            if lineage is not None and lineage.reason == "compaction" and isinstance(call, int):
                replaced[call] = lineage.replaces
        elif b'"answer"' in raw:
            entry = loads_entry(raw)
            if entry is None or entry.get("type") != "outcome":
                continue
            call, answer = entry.get("call"), entry.get("answer")
            if not (isinstance(call, int) and call in replaced and isinstance(answer, dict)):
                continue
            text = message_text(answer.get("content"))
            if text and text.strip():
                found = LoggedSummary(call, text, replaced[call])
    return found
