"""Total JSON encoding for the log: whatever a provider or a platform hands us is recorded exactly.

orjson is the fast path, and most entries take it. It cannot take everything a provider's JSON
can decode to: it refuses integers beyond 64 bits and strings holding lone surrogates, and it
writes NaN and ±Infinity as ``null`` without a word. Python's ``json`` module keeps each of
these exactly (integers as all their digits, ``NaN``/``Infinity`` as the tokens it reads back,
lone surrogates as ``\\uXXXX`` escapes), but that text is not JSON every reader accepts.

So an entry the fast path cannot encode exactly is written in an **escaped** form: ``type``,
``seq`` and ``ts`` as usual, and the rest of the body as one JSON string under ``"escaped"``,
in Python's exact notation. Readers unfold it with :func:`unescape` (or read lines with
:func:`loads_entry`); nothing is ever skipped. A value that is not JSON at all (never produced
by decoding JSON) is kept as ``{"$unencodable": type name, "repr": repr(value)}`` inside the
escaped body rather than dropping the entry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import orjson

ESCAPED = "escaped"
"""The key that marks an escaped entry; its value is the body in Python's exact JSON text."""


def encode_entry(line: Mapping[str, Any]) -> bytes:
    """One log line (no newline) for ``line``, whose first keys are ``type``, ``seq``, ``ts``."""
    try:
        data = orjson.dumps(line)
    except orjson.JSONEncodeError:
        return _escaped(line)
    # orjson writes NaN and ±Infinity as null; only then is a walk of the entry worth its cost.
    if b"null" in data and not _finite(line):
        return _escaped(line)
    return data


def dumps(value: Any, *, indent: bool = False) -> bytes:
    """``value`` as JSON text for people and tools (CLI, viewer): orjson's when it is exact,
    else Python's exact notation (big integers in full, NaN/Infinity, ``\\uXXXX`` escapes)."""
    try:
        data = orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0)
    except orjson.JSONEncodeError:
        return _exact_text(value, indent).encode()
    if b"null" in data and not _finite(value):
        return _exact_text(value, indent).encode()
    return data


def unescape(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with an escaped body unfolded (as it was before encoding); others unchanged.

    An escaped body that does not parse leaves the entry as it is, so a reader reports it as
    the malformed entry it is.
    """
    text = entry.get(ESCAPED)
    if not isinstance(text, str):
        return entry
    try:
        body = json.loads(text)
    except ValueError:
        return entry
    if not isinstance(body, dict):
        return entry
    head = {k: entry[k] for k in ("type", "seq", "ts") if k in entry}
    return {**head, **body}


def loads_entry(raw: bytes | memoryview) -> dict[str, Any] | None:
    """One log line as an entry (escaped bodies unfolded), or ``None`` if it is not a JSON
    object."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    return unescape(value) if ESCAPED in value else value


def _escaped(line: Mapping[str, Any]) -> bytes:
    head = {k: line[k] for k in ("type", "seq", "ts") if k in line}
    body = {k: v for k, v in line.items() if k not in head}
    text = json.dumps(body, ensure_ascii=True, allow_nan=True, separators=(",", ":"),
                      default=_unencodable)
    return orjson.dumps({**head, ESCAPED: text})


def _exact_text(value: Any, indent: bool) -> str:
    return json.dumps(value, ensure_ascii=True, allow_nan=True, indent=2 if indent else None,
                      separators=None if indent else (",", ":"), default=_unencodable)


def _unencodable(value: Any) -> dict[str, str]:
    return {"$unencodable": type(value).__name__, "repr": repr(value)}


def _finite(value: Any) -> bool:
    """False when a float NaN or ±Infinity is anywhere inside ``value``.

    Only exact dicts, lists and tuples are walked: those are what orjson encodes as JSON
    containers (anything else made it raise, and the entry was escaped already).
    """
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            if item != item or item in _INFINITIES:
                return False
        elif kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
    return True


_INFINITIES = (math.inf, -math.inf)
