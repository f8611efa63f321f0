"""The marker an erased person's message leaves in a log that stays (a group's).

Erasing a person (``gateway forget``, ``/forget``) deletes their one-to-one sessions outright.
A shared conversation's log (a Telegram group, a Slack channel or thread) belongs to the chat
and stays, but each message the person sent there is replaced, in place, by a **marker**: the
same ``seq``, ``ts`` and role, so every later call's window (index ranges into the message
list) still points at the right messages, and no text, sender, name, platform id or file::

    {"type": "message", "seq": 12, "ts": "...Z",
     "message": {"role": "user", "content": "[erased]"},
     "meta": {"item": "<item id>"},
     "erased": {"at": "...Z", "subject": "<64 hex>"}}

``subject`` is the tombstone's subject hash (:func:`sessions.tombstones.subject_hash`), so an
audit can tie the marker to its tombstone and nobody can read the id back; ``meta.item`` (a
random id) is kept so an answered message is still recognised as answered. A call whose window
holds a marker is no longer rebuildable: replay says *erased* and offers no body
(``docs/session-format.md``, "Erased messages").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sessions.encoding import encode_entry

ERASED = "erased"
"""The key that marks a message entry as an erased person's."""
MARKER_TEXT = "[erased]"
"""What stands in the erased message's content."""


def marker(entry: Mapping[str, Any], *, subject: str, at: str) -> dict[str, Any]:
    """The marker that replaces the message entry ``entry`` (see the module docstring)."""
    message = entry.get("message")
    role = message.get("role") if isinstance(message, dict) else None
    body: dict[str, Any] = {
        "type": "message",
        "seq": entry.get("seq"),
        "ts": entry.get("ts"),
        "message": {"role": role if isinstance(role, str) else "user", "content": MARKER_TEXT},
    }
    meta = entry.get("meta")
    item = meta.get("item") if isinstance(meta, dict) else None
    if isinstance(item, str):
        body["meta"] = {"item": item}
    body[ERASED] = {"at": at, "subject": subject}
    return body


def marker_line(entry: Mapping[str, Any], *, subject: str, at: str) -> bytes:
    """:func:`marker` as the log line that replaces the entry's (no newline)."""
    return encode_entry(marker(entry, subject=subject, at=at))


def is_marker(entry: Mapping[str, Any]) -> bool:
    """True for a message entry an erasure left (see the module docstring)."""
    return entry.get("type") == "message" and isinstance(entry.get(ERASED), dict)


def erased_at(entry: Mapping[str, Any]) -> str | None:
    """When the marker's message was erased (``None``: not a marker, or no date)."""
    mark = entry.get(ERASED)
    at = mark.get("at") if isinstance(mark, dict) else None
    return at if isinstance(at, str) else None
