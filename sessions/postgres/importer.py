"""Import of JSONL session logs (any format version) into rows, line for line. Pure.

:func:`plan_import` cuts a log's bytes into ``(seq, type, line)`` rows that
:meth:`sessions.postgres.store.PostgresSessionStore.import_log` stores; reading them back gives the
same bytes, less a torn last line, so the import replays as the file does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from sessions.errors import (
    CorruptHeaderError,
    EmptySessionError,
    InvalidNameError,
    SessionReadError,
)
from sessions.names import validate_session_id
from sessions.scan import Summary, split_lines, summarise

_INVALID = object()


@dataclass(frozen=True, slots=True)
class ImportPlan:
    """A JSONL log cut into rows, as ``PostgresSessionStore.import_log`` stores them."""

    header: Mapping[str, Any]
    rows: tuple[tuple[int, str | None, bytes], ...]
    summary: Summary
    torn: bytes
    """The skipped unfinished last line (empty when there was none)."""

    @property
    def size(self) -> int:
        return sum(len(line) + 1 for _, _, line in self.rows)


def plan_import(data: bytes) -> ImportPlan:
    """Rows for a JSONL log's bytes, lines kept byte for byte.

    A line's ``seq`` is its own, or its 0-based line index when it has none (v1/v2 logs); it
    must equal the line index (a gap or duplicate raises :class:`SessionReadError`). A torn
    last line (unfinished, or not JSON, as replay judges it) is left out and returned in
    ``torn``. An empty log or one without a session header raises like replay does.
    """
    lines, unfinished = split_lines(data)
    torn = data[data.rfind(b"\n") + 1:] if unfinished else b""
    if not lines:
        raise EmptySessionError("session file is empty" if not data.strip()
                                else "session holds only a torn header line")
    parsed: list[Any] = []
    for raw in lines:
        try:
            parsed.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            parsed.append(_INVALID)
    if len(lines) > 1 and not torn and parsed[-1] is _INVALID:
        torn = lines.pop() + b"\n"
        parsed.pop()
    header = parsed[0]
    if not isinstance(header, dict) or header.get("type") != "session":
        raise CorruptHeaderError("line 1 is not a session header", line=1)
    rows: list[tuple[int, str | None, bytes]] = []
    for index, (raw, entry) in enumerate(zip(lines, parsed, strict=True)):
        seq: Any = index
        kind: str | None = None
        if isinstance(entry, dict):
            seq = entry.get("seq", index)
            kind = entry["type"] if isinstance(entry.get("type"), str) else None
        if isinstance(seq, bool) or not isinstance(seq, int) or seq != index:
            raise SessionReadError(f"seq {seq!r} where {index} was due (a gap or duplicate)",
                                   line=index + 1)
        rows.append((index, kind, raw))
    summary = summarise(b"".join(line + b"\n" for line in lines))
    return ImportPlan(header=header, rows=tuple(rows), summary=summary, torn=torn)


@dataclass(frozen=True, slots=True)
class ImportResult:
    """What one import stored."""

    session_id: str
    tenant: str
    version: int | None
    entries: int
    size_bytes: int
    torn_bytes: int


def header_id(header: Mapping[str, Any], fallback: str | None) -> object:
    """The id an imported session gets: the header's when it is a valid name, else
    ``fallback`` (a file name, say), else the header's as it is (refused by the caller)."""
    try:
        return validate_session_id(header.get("id"))
    except InvalidNameError:
        return fallback if fallback is not None else header.get("id")


def text_of(value: object) -> str | None:
    """A header field as a column's text (``None`` unless it is a string)."""
    return value if isinstance(value, str) else None
