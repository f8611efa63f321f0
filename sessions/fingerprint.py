"""Content addresses: the seed's prompt fingerprint, reused for sections and tool sets.

The fingerprint is the first 16 hex characters of sha256 over the UTF-8 bytes. It is the seed
project's definition; keeping it means a v2 prompt and a v3 prompt with the same text carry the
same fingerprint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

FINGERPRINT_LENGTH = 16


def fingerprint(text: str) -> str:
    """Fingerprint of a string (a whole prompt or one section)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:FINGERPRINT_LENGTH]


def canonical_json(value: Any) -> bytes:
    """Key-sorted compact JSON: the bytes a tool set's fingerprint is taken over."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def tools_fingerprint(tools: Sequence[Mapping[str, Any]]) -> str:
    """Fingerprint of an ordered list of tool schemas (order matters to the provider)."""
    return hashlib.sha256(canonical_json(list(tools))).hexdigest()[:FINGERPRINT_LENGTH]
