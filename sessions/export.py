"""Export records built from a replay: OTLP/JSON traces and plain request/response lines.

Pure: a :class:`~sessions.replay.Replay` in, JSON-ready dicts out, one per provider call.

``otlp-json`` (:func:`otlp_record`): one OTLP ``TracesData`` per call, the file format the
OpenTelemetry collector's file exporter writes and its file receiver (``otlpjsonfile``) reads,
so a collector, Jaeger, Tempo, Langfuse or Phoenix can ingest an old session. Its one span
(:func:`call_span`) follows the GenAI semantic conventions (:mod:`sessions.genai`): named
``chat {model}``, kind ``CLIENT``, with

* ``gen_ai.operation.name`` = ``"chat"``, ``gen_ai.provider.name`` = the recorded provider
  (``"_OTHER"`` when the log does not say, as in v1/v2 logs: we do not guess it from the
  model name), ``gen_ai.conversation.id`` = session id, ``gen_ai.request.model`` and the
  ``gen_ai.request.*`` params that have a convention;
* ``gen_ai.response.id`` / ``gen_ai.response.model`` when the outcome recorded them (logs
  written before they were recorded lack them), ``gen_ai.usage.*_tokens``,
  ``gen_ai.response.finish_reasons`` (the stop reason mapped; inferred from the answer when no
  outcome recorded one; ``error`` for a failed call, with ``error.type`` = the error kind and
  an ERROR status);
* with content (the default; ``content=False`` leaves these out): ``gen_ai.system_instructions``
  (when the prompt is known), ``gen_ai.input.messages`` (when the window was recorded),
  ``gen_ai.output.messages`` and ``gen_ai.tool.definitions``, as JSON strings;
* ``server.address`` / ``server.port``: host and port of the endpoint the call entry recorded
  (:mod:`sessions.endpoint`); left out for logs written before it was recorded and for calls to
  an in-process provider;
* ours, namespaced: ``gateway.tenant``, ``gateway.call`` and ``gateway.agent.prompt.fingerprint``.

Ids and times: ``traceId`` (32 hex) is derived from the tenant and session id, so every call of
a session shares one trace; ``spanId`` (16 hex) from tenant, session and call number. Both are
sha256 prefixes: the same log always exports the same ids. The start is the call's recorded
time (v3: the ``call`` entry, written just before the request; v1/v2: the assistant message,
the only time recorded); the end is start plus the recorded latency, else left out.

``jsonl`` (:func:`jsonl_record`) is a self-contained request/response record per call:
``session, tenant, call, ts, provider, model, endpoint, params, system, messages, tools,
response, outcome`` (``endpoint`` and ``outcome`` as in ``gateway replay --json``: the
recorded ``scheme://host:port``, ``null`` when the call entry has none).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

from sessions import genai
from sessions.endpoint import server
from sessions.names import DEFAULT_TENANT
from sessions.otlp import SPAN_KIND_CLIENT, Span, traces_data
from sessions.replay import Call, Replay
from sessions.replay_json import endpoint_json, outcome_json

SERVICE = "gateway"
SCOPE = "gateway.export"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

JSONL_KEYS: tuple[str, ...] = (
    "session", "tenant", "call", "ts", "provider", "model", "endpoint", "params", "system",
    "messages", "tools", "response", "outcome",
)


def tenant_of(replay: Replay, default: str = DEFAULT_TENANT) -> str:
    tenant = replay.header.get("tenant")
    return tenant if isinstance(tenant, str) and tenant else default


def trace_id(tenant: str, session: str) -> str:
    """32 hex characters, the same for every call of one session."""
    return hashlib.sha256(f"trace\0{tenant}\0{session}".encode()).hexdigest()[:32]


def span_id(tenant: str, session: str, call: int) -> str:
    """16 hex characters, one per call."""
    return hashlib.sha256(f"span\0{tenant}\0{session}\0{call}".encode()).hexdigest()[:16]


# -- records -----------------------------------------------------------------------------------


def _parse_ts(ts: str | None) -> datetime | None:
    if ts is None:
        return None
    try:
        moment = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def call_span(replay: Replay, call: Call, tenant: str | None = None, *,
              content: bool = True) -> Span:
    """The GenAI inference span of one call (see the module docstring for every field)."""
    session = replay.session_id
    tenant = tenant or tenant_of(replay)
    outcome = replay.outcome_of(call)
    provider = call.provider or _header_str(replay, "provider") or genai.UNKNOWN_PROVIDER
    model = call.model or _header_str(replay, "model")
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": genai.OPERATION_CHAT,
        "gen_ai.provider.name": provider,
        "gen_ai.conversation.id": session,
        "gen_ai.request.model": model,
        **genai.request_attributes(call.params),
    }
    address = server(call.endpoint)
    if address is not None:
        attrs["server.address"], attrs["server.port"] = address
    if outcome is not None:
        attrs["gen_ai.response.id"] = outcome.response_id
        attrs["gen_ai.response.model"] = outcome.response_model
        attrs.update(genai.usage_attributes(outcome.usage))
    system = replay.system_text(call)
    if content and system is not None:
        attrs["gen_ai.system_instructions"] = genai.as_json(genai.system_instructions(system))
    if content and call.window is not None:
        attrs["gen_ai.input.messages"] = genai.as_json(
            [m for message in replay.sent(call) for m in genai.genai_messages(message)])
    error = outcome.error if outcome is not None else None
    reason: str | None = None
    if call.assistant is not None:
        answer = replay.messages[call.assistant]
        reason = genai.answer_reason(answer, outcome.stop_reason if outcome else None)
        if content:
            attrs["gen_ai.output.messages"] = genai.as_json(genai.output_messages(answer, reason))
    elif error is not None:
        reason = "error"
    if reason is not None:
        attrs["gen_ai.response.finish_reasons"] = [reason]
    if error is not None:
        attrs["error.type"] = str(error.get("kind") or "_OTHER")
    tools = replay.tools_of(call)
    if content and tools is not None:
        attrs["gen_ai.tool.definitions"] = genai.as_json(genai.tool_definitions(tools))
    attrs["gateway.tenant"] = tenant
    attrs["gateway.call"] = call.index
    if call.prompt is not None:
        attrs["gateway.agent.prompt.fingerprint"] = call.prompt.fingerprint
    start = _parse_ts(call.ts)
    latency = outcome.latency_ms if outcome is not None else None
    end = start + timedelta(milliseconds=latency) if start is not None and latency else None
    return Span(
        name=f"{genai.OPERATION_CHAT} {model}" if model else genai.OPERATION_CHAT,
        kind=SPAN_KIND_CLIENT,
        trace_id=trace_id(tenant, session),
        span_id=span_id(tenant, session, call.index),
        start_ns=_nanos(start),
        end_ns=_nanos(end),
        attributes=attrs,
        error=(str(error.get("message") or error.get("kind")) if error is not None else None),
    )


def otlp_record(replay: Replay, call: Call, tenant: str | None = None, *,
                content: bool = True) -> dict[str, Any]:
    """One OTLP/JSON ``TracesData`` line holding the call's span."""
    span = call_span(replay, call, tenant, content=content)
    return traces_data([span], {"service.name": SERVICE}, SCOPE)


def _nanos(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    delta = moment - _EPOCH  # exact integer arithmetic: a float timestamp loses nanoseconds
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _header_str(replay: Replay, key: str) -> str | None:
    value = replay.header.get(key)
    return value if isinstance(value, str) and value else None


def jsonl_record(replay: Replay, call: Call, tenant: str | None = None) -> dict[str, Any]:
    """One self-contained request/response record (keys in :data:`JSONL_KEYS` order)."""
    tools = replay.tools_of(call)
    return {
        "session": replay.session_id,
        "tenant": tenant or tenant_of(replay),
        "call": call.index,
        "ts": call.ts,
        "provider": call.provider or _header_str(replay, "provider"),
        "model": call.model or _header_str(replay, "model"),
        "endpoint": endpoint_json(call),
        "params": dict(call.params) if call.params is not None else None,
        "system": replay.system_text(call),
        "messages": replay.sent(call) if call.window is not None else None,
        "tools": list(tools) if tools is not None else None,
        "response": replay.messages[call.assistant] if call.assistant is not None else None,
        "outcome": outcome_json(replay.outcome_of(call)),
    }


RecordBuilder: TypeAlias = Callable[[Replay, Call, str | None], dict[str, Any]]
EXPORT_FORMATS: Mapping[str, RecordBuilder] = {"otlp-json": otlp_record, "jsonl": jsonl_record}


def records(replay: Replay, fmt: str, tenant: str | None = None) -> Iterator[dict[str, Any]]:
    """Every call of ``replay`` as a record of format ``fmt`` (``otlp-json`` or ``jsonl``),
    lazily: a record holds its whole window, so a long session is never held in memory."""
    build = EXPORT_FORMATS.get(fmt)
    if build is None:
        raise ValueError(f"unknown export format {fmt!r} (choose from {', '.join(EXPORT_FORMATS)})")
    return (build(replay, call, tenant) for call in replay.calls)
