"""A turn of a log as the OTLP/JSON trace the live tracer sent for it. Pure.

One ``TracesData`` per turn (:func:`turn_record`), the file format the OpenTelemetry
collector's file exporter writes and its file receiver (``otlpjsonfile``) reads, so a
collector, Jaeger, Tempo, Langfuse or Phoenix can ingest an old session. Its spans follow the
GenAI semantic conventions (:mod:`sessions.genai`) and carry the ids the live tracer gave them
(:mod:`sessions.traces`):

* the turn: ``invoke_agent gateway``, kind INTERNAL, the root: ``gen_ai.operation.name``,
  ``gen_ai.agent.name``, ``gen_ai.conversation.id`` (the session), ``gateway.tenant``,
  ``gateway.channel``, ``gateway.conversation`` and, when the log tells,
  ``gateway.turn.outcome`` (``answered``, ``apologised``, ``refused``; an apology is an
  ERROR with ``error.type``);
* each call, its child: ``chat {model}``, kind CLIENT, ``gen_ai.provider.name`` (``_OTHER``
  when the log does not say, as in v1/v2 logs: never guessed from the model name),
  ``gen_ai.request.*``, ``gen_ai.response.id``/``model`` and ``gen_ai.usage.*`` when
  recorded, ``gen_ai.response.finish_reasons`` for an answer (the stop reason mapped, or
  inferred from the answer), ``server.address``/``server.port`` from the recorded endpoint,
  and ours: ``gateway.tenant``, ``gateway.call`` (its number in ``gateway replay``),
  ``gateway.prompt.fingerprint``. A failed call has ``error.type`` (the recorded error
  kind), an ERROR status and no finish reasons: no response came back;
* each tool call, a child of the call that asked for it: ``execute_tool {name}``, kind
  INTERNAL, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type``; a result the
  tool marked as an error has ``error.type`` ``tool_error``.

Content (:data:`sessions.genai.CONTENT_LEVELS`): ``full`` adds the system instructions, the
messages in and out, the tool definitions and each tool call's arguments and result; ``metadata``
the tool definitions and the messages' shape only; ``none`` nothing of the conversation.

Times: a call starts at its ``call`` entry's time (v1/v2: its answer's, the only time there)
and ends its recorded latency later; a tool call ends when its results were recorded and
starts its recorded duration before; the turn spans its calls and tool calls (a refused turn:
the time of its refusal). What the log does not say is left out, never made up.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sessions import genai
from sessions.endpoint import server
from sessions.otlp import SPAN_KIND_CLIENT, SPAN_KIND_INTERNAL, Span, traces_data
from sessions.replay import Call, Replay
from sessions.traces import (
    Turn,
    call_key,
    call_span_id,
    tool_span_id,
    trace_id,
    turn_span_id,
)

SERVICE = "gateway"
SCOPE = "gateway.export"
AGENT_NAME = "gateway"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def turn_record(replay: Replay, turn: Turn, tenant: str, *, content: str = "full",
                service_version: str | None = None) -> dict[str, Any]:
    """One OTLP/JSON ``TracesData`` line holding the turn's spans."""
    resource: dict[str, Any] = {"service.name": SERVICE}
    if service_version is not None:
        resource["service.version"] = service_version
    return traces_data(turn_spans(replay, turn, tenant, content=content), resource, SCOPE)


def turn_spans(replay: Replay, turn: Turn, tenant: str, *, content: str = "full") -> list[Span]:
    """The turn's span, then each call's span followed by its tool calls' spans."""
    session = replay.session_id
    trace = trace_id(tenant, session, turn.key)
    root = turn_span_id(tenant, session, turn.key)
    children: list[Span] = []
    for call in turn.calls:
        span = call_span(replay, call, tenant, content=content, trace=trace, parent=root)
        children.append(span)
        children.extend(tool_spans(replay, call, tenant, content=content, trace=trace,
                                   parent=span.span_id))
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": genai.OPERATION_AGENT,
        "gen_ai.agent.name": AGENT_NAME,
        "gen_ai.conversation.id": session,
        "gateway.tenant": tenant,
        "gateway.channel": _header_str(replay, "channel"),
        "gateway.conversation": _header_str(replay, "conversation"),
    }
    outcome = _outcome(replay, turn)
    error = None
    if outcome is not None:
        attrs["gateway.turn.outcome"] = outcome
        if outcome == "apologised":
            attrs["error.type"] = error = outcome
    starts: list[int | None] = [s.start_ns for s in children]
    ends: list[int | None] = [s.end_ns if s.end_ns is not None else s.start_ns
                              for s in children]
    if turn.refusal is not None:
        starts = ends = [_nanos(_parse_ts(turn.refusal.ts))]
    span = Span(
        name=f"{genai.OPERATION_AGENT} {AGENT_NAME}", kind=SPAN_KIND_INTERNAL,
        trace_id=trace, span_id=root,
        start_ns=min((n for n in starts if n is not None), default=None),
        end_ns=max((n for n in ends if n is not None), default=None),
        attributes=attrs, error=error,
    )
    return [span, *children]


def _outcome(replay: Replay, turn: Turn) -> str | None:
    """How the turn ended, when the log tells: refused, answered (its last call's answer asks
    for no tool) or apologised (its last call failed)."""
    if turn.refusal is not None:
        return "refused"
    if not turn.calls:
        return None
    last = turn.calls[-1]
    if last.assistant is not None:
        return None if genai.calls_tool(replay.messages[last.assistant]) else "answered"
    outcome = replay.outcome_of(last)
    return "apologised" if outcome is not None and outcome.error else None


def call_span(replay: Replay, call: Call, tenant: str, *, content: str = "full",
              trace: str, parent: str | None) -> Span:
    """The GenAI inference span of one call (see the module docstring for every field)."""
    session = replay.session_id
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
    answer: tuple[Mapping[str, Any], str] | None = None
    if call.assistant is not None:
        message = replay.messages[call.assistant]
        reason = genai.answer_reason(message, outcome.stop_reason if outcome else None)
        attrs["gen_ai.response.finish_reasons"] = [reason]
        answer = (message, reason)
    error = outcome.error if outcome is not None else None
    if error is not None:
        attrs["error.type"] = str(error.get("kind") or "_OTHER")
    attrs.update(genai.call_content(
        content, replay.system_text(call),
        replay.sent(call) if call.window is not None else None,
        replay.tools_of(call), answer))
    attrs["gateway.tenant"] = tenant
    attrs["gateway.call"] = call.index
    if call.prompt is not None:
        attrs["gateway.prompt.fingerprint"] = call.prompt.fingerprint
    start = _parse_ts(call.ts)
    latency = outcome.latency_ms if outcome is not None else None
    end = start + timedelta(milliseconds=latency) if start is not None and latency else None
    return Span(
        name=f"{genai.OPERATION_CHAT} {model}" if model else genai.OPERATION_CHAT,
        kind=SPAN_KIND_CLIENT, trace_id=trace,
        span_id=call_span_id(tenant, session, call_key(call)),
        start_ns=_nanos(start), end_ns=_nanos(end), attributes=attrs, parent_span_id=parent,
        error=(str(error.get("message") or error.get("kind")) if error is not None else None),
    )


def tool_spans(replay: Replay, call: Call, tenant: str, *, content: str = "full",
               trace: str, parent: str) -> list[Span]:
    """The spans of the tool calls ``call``'s answer asked for, whose results the log holds:
    each result, how long it took (``meta.toolCalls``) and when it was recorded."""
    if call.assistant is None:
        return []
    answer = replay.messages[call.assistant].get("content")
    uses = [b for b in answer if isinstance(b, dict) and b.get("type") == "tool_use"
            and isinstance(b.get("id"), str)] if isinstance(answer, list) else []
    if not uses:
        return []
    found = _results(replay, call.assistant, {b["id"] for b in uses})
    spans: list[Span] = []
    for use in uses:
        if use["id"] not in found:
            continue  # the turn stopped before its tools ran (or their results were refused)
        block, ts, ms = found[use["id"]]
        name = str(use.get("name"))
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": genai.OPERATION_TOOL,
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": use["id"],
            "gen_ai.tool.type": "function",
        }
        if content == "full":
            attrs["gen_ai.tool.call.arguments"] = genai.as_json(use.get("input") or {})
            attrs["gen_ai.tool.call.result"] = _result_text(block.get("content", ""))
        failed = bool(block.get("is_error"))
        if failed:
            attrs["error.type"] = "tool_error"
        end = _parse_ts(ts)
        start = end - timedelta(milliseconds=ms) if end is not None and ms is not None else end
        spans.append(Span(
            name=f"{genai.OPERATION_TOOL} {name}", kind=SPAN_KIND_INTERNAL, trace_id=trace,
            span_id=tool_span_id(tenant, replay.session_id, call_key(call), use["id"]),
            start_ns=_nanos(start), end_ns=_nanos(end), attributes=attrs,
            parent_span_id=parent, error="tool_error" if failed else None,
        ))
    return spans


def _results(replay: Replay, after: int, ids: set[str]
             ) -> dict[str, tuple[Mapping[str, Any], str | None, float | None]]:
    """id -> (its tool_result block, when that was recorded, how many ms the call took), from
    the first results message after ``after`` holding each id, before the next answer (a
    conversation runs one turn at a time: its results come before any later answer)."""
    found: dict[str, tuple[Mapping[str, Any], str | None, float | None]] = {}
    for index in range(after + 1, len(replay.messages)):
        if not ids - found.keys():
            break
        entry = replay.messages.entry(index)
        message = entry["message"]
        content = message.get("content")
        if message.get("role") == "assistant":
            break
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        meta = entry.get("meta")
        timings = {c.get("id"): c.get("ms") for c in (meta or {}).get("toolCalls", ())
                   if isinstance(c, dict)} if isinstance(meta, dict) else {}
        ts = entry.get("ts") if isinstance(entry.get("ts"), str) else None
        for block in content:
            if (isinstance(block, dict) and block.get("type") == "tool_result"
                    and block.get("tool_use_id") in ids
                    and block["tool_use_id"] not in found):
                ms = timings.get(block["tool_use_id"])
                found[block["tool_use_id"]] = (
                    block, ts, float(ms) if isinstance(ms, (int, float))
                    and not isinstance(ms, bool) else None)
    return found


def _result_text(content: Any) -> str:
    """A recorded tool result as the text the live tracer got (text blocks joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content
                       if isinstance(b, dict) and b.get("type") == "text")
    return genai.as_json(content)


def _parse_ts(ts: str | None) -> datetime | None:
    if ts is None:
        return None
    try:
        moment = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _nanos(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    delta = moment - _EPOCH  # exact integer arithmetic: a float timestamp loses nanoseconds
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _header_str(replay: Replay, key: str) -> str | None:
    value = replay.header.get(key)
    return value if isinstance(value, str) and value else None
