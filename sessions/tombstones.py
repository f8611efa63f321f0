"""Tombstones: what stays of an erasure, so an audit shows it happened (and nothing else).

When a person's data is erased (``gateway forget``, ``/forget``), their sessions are deleted
from the store and one tombstone is recorded in its place, per tenant. A tombstone names no
content and no raw id: the subject is a SHA-256 of ``tenant\\0channel\\0id``, so an auditor who
knows an id can check that it was erased, and nobody can read the id back from the record.
Format (one JSON object; ``docs/session-format.md``, "Tombstones")::

    {"type": "erasure", "version": 1, "ts": "...Z", "tenant": "T",
     "subject": {"kind": "person", "channel": "telegram", "sha256": "<64 hex>"},
     "requestedBy": "operator" | "self", "sessions": ["<id>", ...],
     "removed": {"<kind>": <count>, ...}}

The JSONL store keeps them in ``erasures.jsonl`` beside the tenant's ``sessions/`` folder, the
PostgreSQL store in its ``erasures`` table; both keep the exact line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from sessions.names import utc_now_iso, validate_name, validate_session_id, validate_tenant

TOMBSTONE_VERSION = 1
ERASURES_FILE = "erasures.jsonl"
REQUESTERS = frozenset({"operator", "self"})


def subject_hash(tenant: str, channel: str, ident: str) -> str:
    """The hex SHA-256 that stands for a person (or chat) in a tombstone."""
    data = f"{tenant}\0{channel}\0{ident}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def tombstone(
    *,
    tenant: str,
    kind: str,
    channel: str,
    ident: str,
    requested_by: str,
    sessions: Sequence[str],
    removed: Mapping[str, int],
    ts: str | None = None,
) -> dict[str, Any]:
    """A tombstone body (validated; ``ident`` only enters it hashed)."""
    validate_tenant(tenant)
    validate_name(channel, "channel")
    if requested_by not in REQUESTERS:
        raise ValueError(f"requested_by must be one of {sorted(REQUESTERS)}")
    return {
        "type": "erasure",
        "version": TOMBSTONE_VERSION,
        "ts": ts or utc_now_iso(),
        "tenant": tenant,
        "subject": {"kind": kind, "channel": channel,
                    "sha256": subject_hash(tenant, channel, ident)},
        "requestedBy": requested_by,
        "sessions": [validate_session_id(s) for s in sessions],
        "removed": {str(k): int(v) for k, v in removed.items()},
    }


def encode(body: Mapping[str, Any]) -> bytes:
    """One line (no newline), as both stores keep it."""
    if body.get("type") != "erasure":
        raise ValueError("not a tombstone")
    return orjson.dumps(body)


def decode_lines(data: bytes) -> list[dict[str, Any]]:
    """Tombstones from stored lines; a torn or foreign line is skipped (never raised)."""
    out: list[dict[str, Any]] = []
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(body, dict) and body.get("type") == "erasure":
            out.append(body)
    return out
