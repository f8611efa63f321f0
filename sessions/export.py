"""Export records built from a replay: OTLP/JSON traces and plain request/response lines.

Pure: a :class:`~sessions.replay.Replay` in, JSON-ready dicts out.

``otlp-json``: one OTLP ``TracesData`` per turn, its spans carrying the ids the live tracer
sent (:mod:`sessions.otlp_export`, :mod:`sessions.traces`).

``jsonl`` (:func:`jsonl_record`) is a self-contained request/response record per call:
``session, tenant, call, ts, provider, model, endpoint, params, system, messages, tools,
response, outcome`` (``endpoint`` and ``outcome`` as in ``gateway replay --json``: the
recorded ``scheme://host:port``, ``null`` when the call entry has none).

How much of the conversation either carries is ``content``
(:data:`sessions.genai.CONTENT_LEVELS`): with ``full`` every record is whole; with
``metadata`` a jsonl record's ``system`` is null and its ``messages`` and ``response`` are
GenAI messages without their content (roles, part types, tool names and ids, file types and
sizes); with ``none`` ``system``, ``messages``, ``tools`` and ``response`` are null.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sessions import genai
from sessions.names import DEFAULT_TENANT
from sessions.otlp_export import turn_record
from sessions.replay import Call, Replay
from sessions.replay_json import endpoint_json, outcome_json
from sessions.traces import turns_of

EXPORT_FORMATS: tuple[str, ...] = ("otlp-json", "jsonl")
JSONL_KEYS: tuple[str, ...] = (
    "session", "tenant", "call", "ts", "provider", "model", "endpoint", "params", "system",
    "messages", "tools", "response", "outcome",
)


def tenant_of(replay: Replay, default: str = DEFAULT_TENANT) -> str:
    tenant = replay.header.get("tenant")
    return tenant if isinstance(tenant, str) and tenant else default


def _header_str(replay: Replay, key: str) -> str | None:
    value = replay.header.get(key)
    return value if isinstance(value, str) and value else None


def jsonl_record(replay: Replay, call: Call, tenant: str | None = None, *,
                 content: str = "full") -> dict[str, Any]:
    """One self-contained request/response record (keys in :data:`JSONL_KEYS` order), with
    ``content`` of the conversation (see the module docstring)."""
    tools = replay.tools_of(call)
    sent = replay.sent(call) if call.window is not None else None
    response = replay.messages[call.assistant] if call.assistant is not None else None
    system = replay.system_text(call)
    if content != "full":
        system = None
        if content == "metadata":
            sent = None if sent is None else genai.metadata_messages(
                [m for message in sent for m in genai.genai_messages(message)])
            response = None if response is None else genai.metadata_messages(
                genai.genai_messages(response))[0]
        else:
            sent = response = tools = None
    return {
        "session": replay.session_id,
        "tenant": tenant or tenant_of(replay),
        "call": call.index,
        "ts": call.ts,
        "provider": call.provider or _header_str(replay, "provider"),
        "model": call.model or _header_str(replay, "model"),
        "endpoint": endpoint_json(call),
        "params": dict(call.params) if call.params is not None else None,
        "system": system,
        "messages": sent,
        "tools": list(tools) if tools is not None else None,
        "response": response,
        "outcome": outcome_json(replay.outcome_of(call)),
    }


def records(replay: Replay, fmt: str, tenant: str | None = None, *, content: str = "full",
            service_version: str | None = None) -> Iterator[dict[str, Any]]:
    """The records of ``replay`` in format ``fmt``: a ``TracesData`` per turn (``otlp-json``),
    or a record per call (``jsonl``), with ``content`` of the conversation. Lazily: a record
    holds whole windows, so a long session is never held in memory."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r} (choose from {', '.join(EXPORT_FORMATS)})")
    if content not in genai.CONTENT_LEVELS:
        raise ValueError(f"unknown content level {content!r} "
                         f"(choose from {', '.join(genai.CONTENT_LEVELS)})")
    owner = tenant or tenant_of(replay)
    if fmt == "jsonl":
        return (jsonl_record(replay, call, owner, content=content) for call in replay.calls)
    return (turn_record(replay, turn, owner, content=content, service_version=service_version)
            for turn in turns_of(replay))
