"""Export records: OTLP/JSON lines (one trace per turn) opentelemetry-proto parses, their
spans' parent links, GenAI attributes and part shapes, ids, times, content levels, JSONL."""

from __future__ import annotations

import base64
import re
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status, TracesData

from sessions import entries
from sessions.export import JSONL_KEYS, jsonl_record, records
from sessions.genai import UNKNOWN_PROVIDER, finish_reason, genai_messages
from sessions.jsonl import JsonlSessionStore
from sessions.otlp import traces_data
from sessions.otlp_export import call_span
from sessions.persist import persist_call, record_outcome
from sessions.records import Lineage, Outcome
from sessions.replay import Replay, replay_bytes
from sessions.replay_json import call_json, replay_json
from sessions.traces import (
    call_span_id,
    tool_span_id,
    trace_id,
    turn_span_id,
    turns_of,
)
from tests.sessions.helpers import (
    PROMPT_A,
    PROMPT_B,
    SEED_DIR,
    SOUL,
    TOOL_TIME,
    TOOLS_A,
    add,
    assistant,
    call_request,
    tool_result,
    tool_use,
    user,
)

Q = user("what time is it?")
USE = tool_use("toolu_1", "get_time", {"tz": "UTC"})
RESULT = tool_result("toolu_1", "12:00")
NOON = assistant("It is noon.")
THANKS = user("thanks")
PARAMS = {"max_tokens": 256, "temperature": 0.2}

FULL_ATTRIBUTES = {
    "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.conversation.id",
    "gen_ai.request.model", "gen_ai.request.max_tokens", "gen_ai.request.temperature",
    "gen_ai.response.id", "gen_ai.response.model",
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.system_instructions",
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.response.finish_reasons",
    "gen_ai.tool.definitions", "gateway.tenant", "gateway.call", "gateway.prompt.fingerprint",
}
PART_KEYS = {
    "text": {"type", "content"},
    "tool_call": {"type", "id", "name", "arguments"},
    "tool_call_response": {"type", "id", "response"},
}
ROLES = {"system", "user", "assistant", "tool"}
FINISH_REASONS = {"stop", "length", "content_filter", "tool_call", "error"}


async def build_export_session(
    data_dir: Path, session_id: str = "s1", tenant: str = "default"
) -> Path:
    """Three calls: a tool call, its answer, and an OpenAI call that timed out."""
    store = JsonlSessionStore(data_dir, durability="none")
    writer = await store.create(tenant=tenant, channel="telegram", conversation=session_id,
                                session_id=session_id)
    await add(writer, Q)
    await persist_call(writer, call_request(PROMPT_A, ((0, 1),), params=PARAMS))
    await add(writer, USE)
    await record_outcome(writer, Outcome(call=0, stop_reason="tool_use",
                                         usage={"input_tokens": 10, "output_tokens": 5},
                                         latency_ms=120.5))
    await add(writer, RESULT)
    await persist_call(writer, call_request(PROMPT_A, ((0, 3),), params=PARAMS))
    await add(writer, NOON)
    await record_outcome(writer, Outcome(call=1, stop_reason="end_turn",
                                         usage={"input_tokens": 30, "output_tokens": 7},
                                         latency_ms=80.0, response_id="msg_2",
                                         response_model="claude-test-20261201"))
    await add(writer, THANKS)
    await persist_call(writer, call_request(PROMPT_B, ((0, 5),), reason="rebuilt",
                                            provider="openai", model="gpt-test", params={}))
    await record_outcome(writer, Outcome(call=2, latency_ms=30000.0,
                                         error={"kind": "timeout", "message": "no answer"}))
    await writer.aclose()
    return writer.path


@pytest.fixture
async def replay(tmp_path: Path) -> Replay:
    return replay_bytes((await build_export_session(tmp_path / "data")).read_bytes())


def assert_genai_messages(messages: list[dict[str, Any]], *, output: bool) -> None:
    """Every message and part has exactly the GenAI schema's fields."""
    for message in messages:
        assert set(message) == ({"role", "parts", "finish_reason"} if output
                                else {"role", "parts"})
        assert message["role"] in ROLES
        if output:
            assert message["finish_reason"] in FINISH_REASONS
        for part in message["parts"]:
            assert set(part) == PART_KEYS[part["type"]]


ID_FIELDS = {"traceId": 32, "spanId": 16, "parentSpanId": 16}


def as_proto_json(record: Any) -> Any:
    """OTLP/JSON differs from protobuf's JSON mapping in one way: ids are hex, not base64.
    Checks the ids are hex of the right length and re-encodes them, so ``json_format`` (strict:
    an unknown field or a wrong type fails) can parse everything else as it is."""
    if isinstance(record, list):
        return [as_proto_json(v) for v in record]
    if not isinstance(record, dict):
        return record
    out = {}
    for key, value in record.items():
        if key in ID_FIELDS:
            assert re.fullmatch(f"[0-9a-f]{{{ID_FIELDS[key]}}}", value), (key, value)
            out[key] = base64.b64encode(bytes.fromhex(value)).decode()
        else:
            out[key] = as_proto_json(value)
    return out


def parse_line(line: bytes) -> TracesData:
    return json_format.ParseDict(as_proto_json(orjson.loads(line)), TracesData())


def parsed_spans(record: dict[str, Any]) -> list[ParsedSpan]:
    """Every span of one record, parsed strictly by opentelemetry-proto, attributes turned
    back into Python values."""
    data = parse_line(orjson.dumps(record))
    (resource,) = data.resource_spans
    (scope,) = resource.scope_spans
    assert next((a.key, a.value.string_value) for a in resource.resource.attributes) == (
        "service.name", "gateway")
    return [ParsedSpan(span, {a.key: _value(a.value) for a in span.attributes})
            for span in scope.spans]


def parsed(record: dict[str, Any]) -> ParsedSpan:
    """A record holding one span (a call's, on its own), parsed."""
    (span,) = parsed_spans(record)
    return span


def call_record(replay: Replay, number: int, *, content: str = "full") -> dict[str, Any]:
    """Call ``number``'s span on its own, as the export builds it inside its turn's trace."""
    call = replay.call(number)
    span = call_span(replay, call, "default", content=content, trace="0" * 31 + "1",
                     parent=None)
    return traces_data([span], {"service.name": "gateway"}, "gateway.export")


class ParsedSpan:
    def __init__(self, span: Any, attrs: dict[str, Any]) -> None:
        self.span, self.attrs = span, attrs


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind)


def content(attrs: dict[str, Any], key: str) -> Any:
    """A structured GenAI attribute, decoded from its JSON-string form."""
    return orjson.loads(attrs[key])


def call_spans(replay: Replay, content: str = "full") -> list[ParsedSpan]:
    """The call (CLIENT) spans of every turn record, in order."""
    return [span for record in records(replay, "otlp-json", content=content)
            for span in parsed_spans(record)
            if span.span.kind == Span.SpanKind.SPAN_KIND_CLIENT]


async def test_every_line_parses_as_otlp_traces_data(replay: Replay) -> None:
    """Each otlp-json line is one TracesData, one per turn, that opentelemetry-proto parses
    strictly."""
    lines = [orjson.dumps(r) for r in records(replay, "otlp-json")]
    assert len(lines) == 2  # "what time is it?" (a tool round: two calls), then "thanks"
    for line in lines:
        parse_line(line)


async def test_a_turn_is_one_trace_whose_parent_links_resolve(replay: Replay) -> None:
    """A turn's record is its trace: the turn span (the root), its calls under it, each tool
    call under the call that asked for it; every parent is a span of the same trace, and the
    ids are the ones sessions.traces derives for them."""
    first, second = (parsed_spans(r) for r in records(replay, "otlp-json"))
    assert [(s.span.name, s.span.kind) for s in first] == [
        ("invoke_agent gateway", Span.SpanKind.SPAN_KIND_INTERNAL),
        ("chat claude-test", Span.SpanKind.SPAN_KIND_CLIENT),
        ("execute_tool get_time", Span.SpanKind.SPAN_KIND_INTERNAL),
        ("chat claude-test", Span.SpanKind.SPAN_KIND_CLIENT)]
    for spans, inbound in ((first, 0), (second, 4)):
        ids = {s.span.span_id for s in spans}
        assert {s.span.trace_id.hex() for s in spans} == {trace_id("default", "s1", inbound)}
        assert spans[0].span.span_id.hex() == turn_span_id("default", "s1", inbound)
        assert spans[0].span.parent_span_id == b""
        assert all(s.span.parent_span_id in ids for s in spans[1:])
    turn, ask, tool, answer = first
    assert [ask.span.span_id.hex(), answer.span.span_id.hex()] == [
        call_span_id("default", "s1", 0), call_span_id("default", "s1", 1)]
    assert [s.span.parent_span_id for s in (ask, answer)] == [turn.span.span_id] * 2
    assert tool.span.parent_span_id == ask.span.span_id
    assert tool.span.span_id.hex() == tool_span_id("default", "s1", 0, "toolu_1")
    assert tool.attrs == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_time",
                          "gen_ai.tool.call.id": "toolu_1", "gen_ai.tool.type": "function",
                          "gen_ai.tool.call.arguments": '{"tz":"UTC"}',
                          "gen_ai.tool.call.result": "12:00"}
    assert turn.attrs == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "gateway",
        "gen_ai.conversation.id": "s1", "gateway.tenant": "default",
        "gateway.channel": "telegram", "gateway.conversation": "s1",
        "gateway.turn.outcome": "answered"}
    assert turn.span.start_time_unix_nano == ask.span.start_time_unix_nano
    assert turn.span.end_time_unix_nano == max(s.span.end_time_unix_nano
                                               for s in (ask, tool, answer))
    (apology, failed) = second
    assert (apology.attrs["gateway.turn.outcome"], apology.attrs["error.type"],
            apology.span.status.code) == ("apologised", "apologised",
                                          Status.StatusCode.STATUS_CODE_ERROR)
    assert failed.span.parent_span_id == apology.span.span_id


async def test_calls_recorded_with_their_turn_are_grouped_by_it(tmp_path: Path) -> None:
    """A log whose calls record the message their turn answers (``inbound``): calls group by
    it even where their windows would not tell (a compaction call, a fallback); a turn a
    budget refused is a trace of its own, with no calls."""
    store = JsonlSessionStore(tmp_path / "data", durability="none")
    writer = await store.create(channel="web", conversation="c", session_id="s1")
    await add(writer, Q)
    await persist_call(writer, replace(call_request(PROMPT_A, ((0, 1),)), inbound=0))
    await add(writer, NOON, THANKS)
    await writer.append([entries.refusal("user_budget", "2026-01-02T00:00:00.000Z")])
    await add(writer, user("again"))
    squeeze = replace(call_request(PROMPT_B, ((0, 2),), reason="compaction"), inbound=3,
                      lineage=Lineage(reason="compaction"))
    await persist_call(writer, squeeze)
    await persist_call(writer, replace(call_request(PROMPT_A, ((2, 4),)), inbound=3))
    await writer.aclose()
    replay = replay_bytes(writer.path.read_bytes())
    turns = turns_of(replay)
    assert [(t.key, [c.index for c in t.calls], t.refusal is not None) for t in turns] == [
        (0, [1], False), (2, [], True), (3, [2, 3], False)]
    refused = parsed_spans(list(records(replay, "otlp-json"))[1])
    assert [(s.span.name, s.attrs.get("gateway.turn.outcome")) for s in refused] == [
        ("invoke_agent gateway", "refused")]
    assert refused[0].span.trace_id.hex() == trace_id("default", "s1", 2)


async def test_content_levels(replay: Replay) -> None:
    """full: prompts, messages, tools, arguments and results; metadata: tool definitions and
    the messages' shape (roles, part types, tool names and ids) without a word of them; none:
    nothing of the conversation. Ids, models and usage are in all three."""
    spans = {level: [s for r in records(replay, "otlp-json", content=level)
                     for s in parsed_spans(r)] for level in ("full", "metadata", "none")}
    texts = ("what time is it?", "It is noon.", "12:00", "UTC", SOUL)
    for level, found in spans.items():
        everything = orjson.dumps([s.attrs for s in found]).decode()
        assert all((text in everything) == (level == "full") for text in texts), level
        assert [s.span.span_id for s in found] == [s.span.span_id for s in spans["full"]]
    ask = spans["metadata"][1].attrs
    assert content(ask, "gen_ai.input.messages") == [
        {"role": "user", "parts": [{"type": "text"}]}]
    assert content(ask, "gen_ai.output.messages") == [{"role": "assistant", "parts": [
        {"type": "tool_call", "id": "toolu_1", "name": "get_time"}], "finish_reason": "tool_call"}]
    assert content(ask, "gen_ai.tool.definitions")[0]["name"] == "get_time"
    assert "gen_ai.system_instructions" not in ask
    assert not {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.definitions",
                "gen_ai.system_instructions", "gen_ai.tool.call.arguments",
                "gen_ai.tool.call.result"} & {k for s in spans["none"] for k in s.attrs}
    assert spans["none"][1].attrs["gen_ai.usage.output_tokens"] == 5
    lines = {level: list(records(replay, "jsonl", content=level))
             for level in ("full", "metadata", "none")}
    assert [(r["system"], r["messages"], r["tools"], r["response"])
            for r in lines["none"]] == [(None, None, None, None)] * 3
    assert lines["metadata"][0]["messages"] == [{"role": "user", "parts": [{"type": "text"}]}]
    assert lines["metadata"][0]["system"] is None
    assert lines["metadata"][0]["tools"] == [TOOL_TIME]
    assert lines["full"][0]["messages"] == [Q]


async def test_service_version_in_the_resource(replay: Replay) -> None:
    """The exporter's version is the resource's service.version, when given."""
    (record, _) = records(replay, "otlp-json", service_version="1.2.3")
    resource = parse_line(orjson.dumps(record)).resource_spans[0].resource
    assert {a.key: a.value.string_value for a in resource.attributes} == {
        "service.name": "gateway", "service.version": "1.2.3"}


async def test_span_fields_and_required_attributes(replay: Replay) -> None:
    """A successful call is a CLIENT span carrying the full set of GenAI attributes, with
    gen_ai.provider.name and never the deprecated gen_ai.system."""
    got = parsed(call_record(replay, 2))
    span, attrs = got.span, got.attrs
    assert (span.name, span.kind, span.status.code) == (
        "chat claude-test", Span.SpanKind.SPAN_KIND_CLIENT, Status.StatusCode.STATUS_CODE_UNSET)
    assert set(attrs) == FULL_ATTRIBUTES
    assert "gen_ai.system" not in attrs
    assert {k: attrs[k] for k in FULL_ATTRIBUTES - {
        "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.definitions",
        "gen_ai.system_instructions"}} == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.conversation.id": "s1",
        "gen_ai.request.model": "claude-test",
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.temperature": 0.2,
        "gen_ai.response.id": "msg_2",
        "gen_ai.response.model": "claude-test-20261201",
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.response.finish_reasons": ["stop"],
        "gateway.tenant": "default",
        "gateway.call": 2,
        "gateway.prompt.fingerprint": PROMPT_A.fingerprint,
    }
    assert content(attrs, "gen_ai.system_instructions") == [
        {"type": "text", "content": PROMPT_A.text}]
    assert content(attrs, "gen_ai.tool.definitions") == [{
        "type": "function", "name": "get_time", "description": TOOL_TIME["description"],
        "parameters": TOOL_TIME["input_schema"],
    }]
    assert TOOLS_A == (TOOL_TIME,)


async def test_without_content_no_prompt_or_message_leaves(replay: Replay) -> None:
    """content "none" keeps ids, model and usage but drops prompts, messages and tools."""
    attrs = parsed(call_record(replay, 2, content="none")).attrs
    assert not {"gen_ai.system_instructions", "gen_ai.input.messages",
                "gen_ai.output.messages", "gen_ai.tool.definitions"} & set(attrs)
    assert attrs["gen_ai.usage.output_tokens"] == 7


async def test_input_and_output_messages_follow_the_genai_schema(replay: Replay) -> None:
    """Text, tool_call and tool_call_response parts; tool results in a "tool" message."""
    attrs = parsed(call_record(replay, 2)).attrs
    assert content(attrs, "gen_ai.input.messages") == [
        {"role": "user", "parts": [{"type": "text", "content": "what time is it?"}]},
        {"role": "assistant", "parts": [
            {"type": "tool_call", "id": "toolu_1", "name": "get_time", "arguments": {"tz": "UTC"}},
        ]},
        {"role": "tool", "parts": [
            {"type": "tool_call_response", "id": "toolu_1", "response": "12:00"},
        ]},
    ]
    assert content(attrs, "gen_ai.output.messages") == [
        {"role": "assistant", "parts": [{"type": "text", "content": "It is noon."}],
         "finish_reason": "stop"},
    ]
    for call in replay.calls:
        a = parsed(call_record(replay, call.index)).attrs
        assert_genai_messages(content(a, "gen_ai.input.messages"), output=False)
        if "gen_ai.output.messages" in a:
            assert_genai_messages(content(a, "gen_ai.output.messages"), output=True)


async def test_tool_call_finish_reason(replay: Replay) -> None:
    """A tool_use stop reason becomes finish_reason "tool_call" on the output message."""
    attrs = parsed(call_record(replay, 1)).attrs
    output = content(attrs, "gen_ai.output.messages")
    assert output[0]["finish_reason"] == "tool_call"
    assert attrs["gen_ai.response.finish_reasons"] == ["tool_call"]
    assert output[0]["parts"] == [
        {"type": "tool_call", "id": "toolu_1", "name": "get_time", "arguments": {"tz": "UTC"}},
    ]


async def test_failed_call_has_error_type(replay: Replay) -> None:
    """A failed call: error.type, no finish reasons (no response came back), no output,
    status ERROR."""
    got = parsed(call_record(replay, 3))
    span, attrs = got.span, got.attrs
    assert attrs["error.type"] == "timeout"
    assert "gen_ai.output.messages" not in attrs
    assert "gen_ai.response.finish_reasons" not in attrs
    assert (span.status.code, span.status.message) == (
        Status.StatusCode.STATUS_CODE_ERROR, "no answer")
    assert (span.name, attrs["gen_ai.provider.name"], attrs["gen_ai.request.model"]) == (
        "chat gpt-test", "openai", "gpt-test")
    assert "gen_ai.request.max_tokens" not in attrs
    assert "gen_ai.usage.input_tokens" not in attrs
    assert [m["role"] for m in content(attrs, "gen_ai.input.messages")] == [
        "user", "assistant", "tool", "assistant", "user"]


async def test_ids_are_deterministic_hex(replay: Replay) -> None:
    """traceId is 32 hex per turn, spanId 16 hex per span, all distinct and equal on every
    export; another tenant's same session id gives other ids."""
    spans = [s.span for r in records(replay, "otlp-json") for s in parsed_spans(r)]
    assert len({s.span_id for s in spans}) == len(spans) == 6
    assert len({s.trace_id for s in spans}) == 2
    assert all(re.fullmatch(r"[0-9a-f]{32}", trace_id("t", "s", n)) for n in range(5))
    assert list(records(replay, "otlp-json")) == list(records(replay, "otlp-json"))
    assert trace_id("acme", "s1", 0) != trace_id("default", "s1", 0)
    assert call_span_id("default", "s1", 0) != turn_span_id("default", "s1", 0)


async def test_times_from_the_call_entry_and_latency(replay: Replay) -> None:
    """The start is the call's ts in nanoseconds; the end adds the recorded latency."""
    span = parsed(call_record(replay, 1)).span
    ts = replay.call(1).ts
    assert ts is not None
    start = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    assert span.start_time_unix_nano == round(start.timestamp() * 1000) * 1_000_000
    assert span.end_time_unix_nano - span.start_time_unix_nano == 120_500_000


async def test_jsonl_record_is_self_contained(replay: Replay) -> None:
    """jsonl: exactly the documented keys, the sent messages, prompt text, tools and outcome."""
    rec = jsonl_record(replay, replay.call(2))
    assert list(rec) == list(JSONL_KEYS)
    assert {k: rec[k] for k in ("session", "tenant", "call", "provider", "model", "params")} == {
        "session": "s1", "tenant": "default", "call": 2, "provider": "anthropic",
        "model": "claude-test", "params": PARAMS,
    }
    assert rec["system"] == PROMPT_A.text
    assert rec["messages"] == [Q, USE, RESULT]
    assert rec["tools"] == [TOOL_TIME]
    assert rec["response"] == NOON
    assert rec["outcome"] == {"stopReason": "end_turn", "usage": {"input_tokens": 30,
                              "output_tokens": 7}, "latencyMs": 80.0, "error": None,
                              "responseId": "msg_2", "responseModel": "claude-test-20261201",
                              "costUsd": None}
    failed = jsonl_record(replay, replay.call(3))
    assert (failed["response"], failed["outcome"]["error"]) == (
        None, {"kind": "timeout", "message": "no answer"})
    assert failed["system"] == PROMPT_B.text
    orjson.dumps(rec)  # JSON-ready as built


def test_seed_v2_provider_unknown_and_finish_reason_inferred() -> None:
    """v1/v2 logs: provider "_OTHER" (not guessed), finish reason inferred from the answer."""
    seed = replay_bytes((SEED_DIR / "v2-prompt-timeline.jsonl").read_bytes())
    spans = call_spans(seed)
    assert [s.attrs["gen_ai.provider.name"] for s in spans] == [UNKNOWN_PROVIDER] * 3
    assert [s.attrs["gen_ai.request.model"] for s in spans] == ["claude-sonnet-4-5"] * 3
    assert [content(s.attrs, "gen_ai.output.messages")[0]["finish_reason"] for s in spans] == [
        "tool_call", "stop", "stop"]
    assert [s.span.end_time_unix_nano for s in spans] == [0] * 3  # no latency recorded
    assert not any(k.startswith("server.") for s in spans for k in s.attrs)  # no endpoint
    for span in spans:
        assert_genai_messages(content(span.attrs, "gen_ai.input.messages"), output=False)
        assert_genai_messages(content(span.attrs, "gen_ai.output.messages"), output=True)


async def test_server_address_and_port_from_the_recorded_endpoint(tmp_path: Path) -> None:
    """A call entry's endpoint becomes server.address/server.port (the span still parses
    strictly); a call recorded without one (older logs, in-process providers) has neither."""
    replay = replay_bytes(await endpoint_session(tmp_path))
    spans = [s.attrs for s in call_spans(replay)]
    assert [(a.get("server.address"), a.get("server.port")) for a in spans] == [
        ("api.anthropic.com", 443), ("::1", 8080), (None, None)]
    assert not any(key.startswith("server.") for key in spans[2])


async def endpoint_session(tmp_path: Path) -> bytes:
    """A log of three calls: to Anthropic's default endpoint, to a proxy given with a key in
    its URL (the writer keeps only its origin), and to an in-process provider (none)."""
    store = JsonlSessionStore(tmp_path / "data", durability="none")
    writer = await store.create(channel="web", conversation="c", session_id="s1")
    await add(writer, Q)
    request = call_request(PROMPT_A, ((0, 1),))
    await persist_call(writer, replace(request, endpoint="https://api.anthropic.com"))
    await persist_call(writer, replace(request, provider="openai",
                                       endpoint="http://key@[::1]:8080/v1?api_key=sk"))
    await persist_call(writer, request)
    await writer.aclose()
    return writer.path.read_bytes()


ENDPOINTS = ["https://api.anthropic.com:443", "http://[::1]:8080", None]


async def test_jsonl_records_and_replay_json_carry_the_endpoint(tmp_path: Path) -> None:
    """`endpoint` is in every jsonl record and every turn of the replay JSON: the recorded
    origin, or null for a call entry without one."""
    replay = replay_bytes(await endpoint_session(tmp_path))
    assert [r["endpoint"] for r in records(replay, "jsonl")] == ENDPOINTS
    assert [t["endpoint"] for t in replay_json(replay)["calls"]] == ENDPOINTS
    assert [call_json(replay, t)["endpoint"] for t in replay.calls] == ENDPOINTS


async def test_an_endpoint_edited_into_a_log_comes_out_as_an_origin_only(
        tmp_path: Path) -> None:
    """A log whose call entry was edited to hold a whole URL (a key in it) still gives out only
    its origin; one that is no http(s) URL gives null."""
    data = await endpoint_session(tmp_path)
    data = data.replace(b'"https://api.anthropic.com:443"',
                        b'"https://sk-secret@api.anthropic.com/v1?key=sk-2"', 1)
    data = data.replace(b'"http://[::1]:8080"', b'"file:///etc/passwd"', 1)
    assert b"sk-secret" in data
    assert b"/etc/passwd" in data
    replay = replay_bytes(data)
    assert [r["endpoint"] for r in records(replay, "jsonl")] == [
        "https://api.anthropic.com:443", None, None]
    assert [t["endpoint"] for t in replay_json(replay)["calls"]] == [
        "https://api.anthropic.com:443", None, None]


def test_seed_v2_calls_have_a_null_endpoint() -> None:
    """Logs written before endpoints were recorded: the key is there, null."""
    seed = replay_bytes((SEED_DIR / "v2-prompt-timeline.jsonl").read_bytes())
    assert [r["endpoint"] for r in records(seed, "jsonl")] == [None] * 3
    assert [t["endpoint"] for t in replay_json(seed)["calls"]] == [None] * 3


def test_seed_turn_before_first_prompt_has_no_system_instructions() -> None:
    """A turn with no recorded prompt gets no gen_ai.system_instructions (never back-filled)."""
    seed = replay_bytes((SEED_DIR / "v2-late-prompt-torn-tail.jsonl").read_bytes())
    first, second = (s.attrs for s in call_spans(seed))
    assert "gen_ai.system_instructions" not in first
    assert content(second, "gen_ai.system_instructions") == [
        {"type": "text", "content": "You are Lisa, v2."}]


@pytest.mark.parametrize(
    ("stop", "reason"),
    [("end_turn", "stop"), ("stop_sequence", "stop"), ("tool_use", "tool_call"),
     ("tool_calls", "tool_call"), ("max_tokens", "length"), ("refusal", "content_filter"),
     ("something_new", "something_new"), (None, "stop")],
)
def test_finish_reason_mapping(stop: str | None, reason: str) -> None:
    """Recorded stop reasons map onto the GenAI finish reasons; unknown ones pass through."""
    assert finish_reason(stop) == reason


def test_mixed_message_splits_tool_results_first() -> None:
    """A stored message with tool results and text becomes a tool message, then the text."""
    message = {"role": "user", "content": [
        {"type": "text", "text": "and also"},
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}],
         "is_error": True},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
    ]}
    assert genai_messages(message) == [
        {"role": "tool", "parts": [
            {"type": "tool_call_response", "id": "t1", "response": "ok", "is_error": True}]},
        {"role": "user", "parts": [
            {"type": "text", "content": "and also"},
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
    ]


def test_unknown_format_is_refused() -> None:
    """records() names the formats it knows."""
    seed = replay_bytes((SEED_DIR / "v2-no-prompts.jsonl").read_bytes())
    with pytest.raises(ValueError, match="choose from otlp-json, jsonl"):
        records(seed, "xml")
