"""Export records built from a replay: OpenTelemetry GenAI spans and plain request/response lines.

Pure: a :class:`~sessions.replay.Replay` in, JSON-ready dicts out, one per provider call (turn).

``otel`` (:func:`otel_record`) follows the OpenTelemetry GenAI semantic conventions (development
status, checked against semantic-conventions ``docs/gen-ai/gen-ai-spans.md`` and the
``gen-ai-input-messages.json`` / ``gen-ai-output-messages.json`` schemas): one inference span
per call, named ``chat {model}``, kind ``CLIENT``, with these attributes:

* ``gen_ai.operation.name`` = ``"chat"``; ``gen_ai.provider.name`` and the older
  ``gen_ai.system`` = the recorded provider (``"_OTHER"`` when the log does not say, as in v1/v2
  logs: we do not guess it from the model name); ``gen_ai.conversation.id`` = session id;
  ``gen_ai.request.model``.
* ``gen_ai.request.*`` for the recorded params that have a convention (``max_tokens``,
  ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` (also from OpenAI's ``stop``),
  ``seed``, ``frequency_penalty``, ``presence_penalty``).
* ``gen_ai.usage.input_tokens`` / ``output_tokens`` when the outcome recorded usage.
* ``gen_ai.system_instructions`` = ``[{"type": "text", "content": prompt}]`` when the prompt
  is known (never back-filled; absent otherwise).
* ``gen_ai.input.messages``: the messages sent, as ``{"role", "parts"}``. Stored Anthropic-style
  blocks map to parts: ``text`` -> ``{"type": "text", "content"}``, ``tool_use`` ->
  ``{"type": "tool_call", "id", "name", "arguments"}``, ``tool_result`` ->
  ``{"type": "tool_call_response", "id", "response"}`` (these go in a ``"tool"`` role message,
  ahead of any text of the same stored message), ``thinking`` -> ``{"type": "reasoning",
  "content"}``; any other block is kept as a generic part with its own fields. Absent when the
  window was not recorded.
* ``gen_ai.output.messages``: the assistant answer as one message with ``finish_reason``;
  ``gen_ai.response.finish_reasons`` = ``[finish_reason]``. The finish reason maps the recorded
  stop reason (``end_turn``/``stop_sequence``/``stop`` -> ``stop``, ``tool_use``/
  ``tool_calls`` -> ``tool_call``, ``max_tokens``/``length`` -> ``length``, ``refusal``/
  ``content_filter`` -> ``content_filter``, anything else verbatim). When no outcome recorded a
  stop reason (v1/v2 logs) it is inferred from the answer: ``tool_call`` if it calls a tool,
  else ``stop``. A failed call has no output messages, finish reason ``error`` and
  ``error.type`` = the recorded error kind.
* ``gen_ai.tool.definitions`` when a tool set was recorded (``{"type": "function", "name",
  "description", "parameters"}``).
* ``gateway.tenant``, ``gateway.turn`` and ``gateway.prompt.fingerprint`` (ours, namespaced).

Ids and times: ``trace_id`` (32 hex) is derived from the tenant and session id, so every call of
a session shares one trace; ``span_id`` (16 hex) from tenant, session and turn number. Both are
sha256 prefixes: the same log always exports the same ids. ``start_time`` is the turn's recorded
time (v3: the ``call`` entry, written just before the request; v1/v2: the assistant message, the
only time recorded); ``end_time`` is start plus the recorded latency, else null.

``jsonl`` (:func:`jsonl_record`) is a self-contained request/response record per call:
``session, tenant, turn, ts, provider, model, params, system, messages, tools, response,
outcome`` (``outcome`` as in ``gateway replay --json``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

from sessions.names import DEFAULT_TENANT
from sessions.replay import Replay, Turn
from sessions.replay_json import outcome_json

OPERATION = "chat"
UNKNOWN_PROVIDER = "_OTHER"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

JSONL_KEYS: tuple[str, ...] = (
    "session", "tenant", "turn", "ts", "provider", "model", "params", "system", "messages",
    "tools", "response", "outcome",
)

_REQUEST_PARAMS: Mapping[str, str] = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "stop_sequences": "gen_ai.request.stop_sequences",
    "stop": "gen_ai.request.stop_sequences",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}

_FINISH_REASONS: Mapping[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "stop": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_call",
    "tool_calls": "tool_call",
    "function_call": "tool_call",
    "max_tokens": "length",
    "length": "length",
    "refusal": "content_filter",
    "content_filter": "content_filter",
}


def tenant_of(replay: Replay, default: str = DEFAULT_TENANT) -> str:
    tenant = replay.header.get("tenant")
    return tenant if isinstance(tenant, str) and tenant else default


def trace_id(tenant: str, session: str) -> str:
    """32 hex characters, the same for every call of one session."""
    return hashlib.sha256(f"trace\0{tenant}\0{session}".encode()).hexdigest()[:32]


def span_id(tenant: str, session: str, turn: int) -> str:
    """16 hex characters, one per call."""
    return hashlib.sha256(f"span\0{tenant}\0{session}\0{turn}".encode()).hexdigest()[:16]


def finish_reason(stop_reason: str | None) -> str:
    """The GenAI finish reason of a recorded stop reason (unknown ones verbatim)."""
    if stop_reason is None:
        return "stop"
    return _FINISH_REASONS.get(stop_reason, stop_reason)


# -- messages ----------------------------------------------------------------------------------


def _part(block: Any) -> dict[str, Any]:
    if not isinstance(block, dict):
        return {"type": "text", "content": str(block)}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": str(block.get("text", ""))}
    if kind == "tool_use":
        return {"type": "tool_call", "id": block.get("id"), "name": block.get("name"),
                "arguments": block.get("input")}
    if kind == "tool_result":
        part: dict[str, Any] = {"type": "tool_call_response", "id": block.get("tool_use_id"),
                                "response": _tool_response(block.get("content", ""))}
        if block.get("is_error"):
            part["is_error"] = True
        return part
    if kind == "thinking":
        return {"type": "reasoning", "content": str(block.get("thinking", ""))}
    return {"type": str(kind), **{k: v for k, v in block.items() if k != "type"}}


def _tool_response(content: Any) -> Any:
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" for b in content
    ):
        return "".join(str(b.get("text", "")) for b in content)
    return content


def genai_messages(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One stored message as GenAI messages (tool results become a ``tool`` role message)."""
    role = str(message.get("role"))
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "parts": [{"type": "text", "content": content}]}]
    blocks = content if isinstance(content, list) else []
    results = [_part(b) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
    others = [_part(b) for b in blocks if not (isinstance(b, dict)
                                              and b.get("type") == "tool_result")]
    out: list[dict[str, Any]] = []
    if results:
        out.append({"role": "tool", "parts": results})
    if others or not results:
        out.append({"role": role, "parts": others})
    return out


def _calls_tool(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_use" for b in content
    )


def _tool_definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description", ""),
        "parameters": tool.get("input_schema", {"type": "object", "properties": {}}),
    }


# -- records -----------------------------------------------------------------------------------


def _parse_ts(ts: str | None) -> datetime | None:
    if ts is None:
        return None
    try:
        moment = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _iso(moment: datetime) -> str:
    # The log's own precision (milliseconds) unless a latency added sub-millisecond time.
    spec = "milliseconds" if moment.microsecond % 1000 == 0 else "microseconds"
    return moment.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def otel_record(replay: Replay, turn: Turn, tenant: str | None = None) -> dict[str, Any]:
    """The GenAI inference span of one call (see the module docstring for every field)."""
    session = replay.session_id
    tenant = tenant or tenant_of(replay)
    outcome = replay.outcome_of(turn)
    provider = turn.provider or _header_str(replay, "provider") or UNKNOWN_PROVIDER
    model = turn.model or _header_str(replay, "model")
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gen_ai.conversation.id": session,
    }
    if model:
        attrs["gen_ai.request.model"] = model
    for key, value in (turn.params or {}).items():
        name = _REQUEST_PARAMS.get(key)
        if name is not None and value is not None:
            attrs.setdefault(name, [value] if name.endswith("stop_sequences")
                             and isinstance(value, str) else value)
    usage = outcome.usage if outcome is not None else None
    for key in ("input_tokens", "output_tokens"):
        if usage and isinstance(usage.get(key), int):
            attrs[f"gen_ai.usage.{key}"] = usage[key]
    if turn.prompt is not None and turn.prompt.text is not None:
        attrs["gen_ai.system_instructions"] = [{"type": "text", "content": turn.prompt.text}]
    if turn.window is not None:
        attrs["gen_ai.input.messages"] = [
            m for message in replay.sent(turn) for m in genai_messages(message)
        ]
    error = outcome.error if outcome is not None else None
    reason: str | None = None
    if turn.assistant is not None:
        answer = replay.messages[turn.assistant]
        recorded = outcome.stop_reason if outcome is not None else None
        reason = finish_reason(recorded) if recorded is not None else (
            "tool_call" if _calls_tool(answer) else "stop")
        parts = [p for m in genai_messages(answer) for p in m["parts"]]
        attrs["gen_ai.output.messages"] = [
            {"role": "assistant", "parts": parts, "finish_reason": reason}
        ]
    elif error is not None:
        reason = "error"
        attrs["gen_ai.output.messages"] = []
    if reason is not None:
        attrs["gen_ai.response.finish_reasons"] = [reason]
    if error is not None:
        attrs["error.type"] = str(error.get("kind") or "_OTHER")
    tools = replay.tools_of(turn)
    if tools is not None:
        attrs["gen_ai.tool.definitions"] = [_tool_definition(t) for t in tools]
    attrs["gateway.tenant"] = tenant
    attrs["gateway.turn"] = turn.index
    if turn.prompt is not None:
        attrs["gateway.prompt.fingerprint"] = turn.prompt.fingerprint

    start = _parse_ts(turn.ts)
    latency = outcome.latency_ms if outcome is not None else None
    end = start + timedelta(milliseconds=latency) if start is not None and latency else None
    status: dict[str, Any] = {"code": "UNSET"}
    if error is not None:
        status = {"code": "ERROR", "message": str(error.get("message") or error.get("kind"))}
    return {
        "name": f"{OPERATION} {model}" if model else OPERATION,
        "kind": "CLIENT",
        "trace_id": trace_id(tenant, session),
        "span_id": span_id(tenant, session, turn.index),
        "start_time": _iso(start) if start is not None else turn.ts,
        "end_time": _iso(end) if end is not None else None,
        "start_time_unix_nano": _nanos(start),
        "end_time_unix_nano": _nanos(end),
        "status": status,
        "attributes": attrs,
    }


def _nanos(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    delta = moment - _EPOCH  # exact integer arithmetic: a float timestamp loses nanoseconds
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _header_str(replay: Replay, key: str) -> str | None:
    value = replay.header.get(key)
    return value if isinstance(value, str) and value else None


def jsonl_record(replay: Replay, turn: Turn, tenant: str | None = None) -> dict[str, Any]:
    """One self-contained request/response record (keys in :data:`JSONL_KEYS` order)."""
    tools = replay.tools_of(turn)
    return {
        "session": replay.session_id,
        "tenant": tenant or tenant_of(replay),
        "turn": turn.index,
        "ts": turn.ts,
        "provider": turn.provider or _header_str(replay, "provider"),
        "model": turn.model or _header_str(replay, "model"),
        "params": dict(turn.params) if turn.params is not None else None,
        "system": turn.prompt.text if turn.prompt is not None else None,
        "messages": replay.sent(turn) if turn.window is not None else None,
        "tools": list(tools) if tools is not None else None,
        "response": replay.messages[turn.assistant] if turn.assistant is not None else None,
        "outcome": outcome_json(replay.outcome_of(turn)),
    }


RecordBuilder: TypeAlias = Callable[[Replay, Turn, str | None], dict[str, Any]]
EXPORT_FORMATS: Mapping[str, RecordBuilder] = {"otel": otel_record, "jsonl": jsonl_record}


def records(replay: Replay, fmt: str, tenant: str | None = None) -> Iterator[dict[str, Any]]:
    """Every call of ``replay`` as a record of format ``fmt`` (``otel`` or ``jsonl``), lazily:
    a record holds its whole window, so a long session is never held in memory at once."""
    build = EXPORT_FORMATS.get(fmt)
    if build is None:
        raise ValueError(f"unknown export format {fmt!r} (choose from {', '.join(EXPORT_FORMATS)})")
    return (build(replay, turn, tenant) for turn in replay.turns)
