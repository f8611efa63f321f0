"""The owed journal's lines as bytes: records encoded into lines, and lines read back.

Pure (no file, no state, no clock): :class:`coordination.journal.FileJournal` writes the lines
its module docstring lists with :func:`encode`, a rewrite renders its snapshot of the live
records with :func:`render`, and an erasure reads the file back with :func:`parsed` and counts
a person's lines with :func:`names`. Apart from the journal's state and its disk, so the
format is read and written in one place and can be tested without a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from coordination.seen_keys import Remembered, rendered


@dataclass(frozen=True, slots=True)
class OwedItem:
    """One owed item, as :meth:`FileJournal.owed` lists them (arrival order)."""

    id: str
    conversation: str
    key: str | None
    at: float
    item: str
    """The item in its wire form (:func:`coordination.keys.encode_item`)."""


Snapshot = tuple[list[OwedItem], list[str], tuple[list[tuple[bytes, bytes]], dict[int, str]]]
"""The live records a rewrite renders: owed items, the queued ids, remembered keys."""

def render(owed: list[OwedItem], kept: list[str],
           seen: tuple[list[tuple[bytes, bytes]], dict[int, str]]) -> tuple[bytes, int]:
    """The file a rewrite writes: the live records as lines, and how many."""
    lines = [encode(["owe", o.id, o.conversation, o.key, o.at, o.item]) for o in owed]
    lines += [encode(["kept", item_id]) for item_id in kept]
    lines += [seen_line(s) for s in rendered(seen)]
    return b"".join(lines), len(lines)


def parsed(data: bytes) -> list[list[Any]]:
    """The journal's lines as read back (torn or foreign ones left out)."""
    found: list[list[Any]] = []
    for raw in data.split(b"\n"):
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(line, list) and len(line) >= 2:
            found.append(line)
    return found


def seen_line(seen: Remembered) -> bytes:
    return encode(["seen#", seen.digest.hex(), seen.item, seen.session, seen.at])


def names(line: list[Any], items: set[str], sessions: set[str]) -> bool:
    """Whether a journal line is about one of ``items`` (or answered in ``sessions``)."""
    if line[0] in ("seen", "seen#") and len(line) == 5:
        return line[2] in items or line[3] in sessions
    if line[0] == "paid" and len(line) == 4:
        return line[1] in items or line[2] in sessions
    return line[1] in items


def encode(value: list[Any]) -> bytes:
    """One line of the file: ``value`` as JSON, and its newline."""
    return orjson.dumps(value) + b"\n"
