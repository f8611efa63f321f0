"""Live traces: a gateway with OTEL_EXPORTER_OTLP_ENDPOINT set sends a span per turn, a child
span per provider call and, under its call, per tool call to an OTLP/HTTP receiver on loopback
(a small aiohttp server decoding the protobuf, as a collector would); `gateway export` of the
same session gives every span the ids the receiver got."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from app.cli import main
from app.compose import build_gateway
from app.config import Settings
from gateway.edge.observe import NO_OBSERVER
from tests.web_ids import WEB_TENANT, client_label


class Receiver:
    """POST /v1/traces: decodes each ExportTraceServiceRequest and keeps its spans."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.resources: list[dict[str, Any]] = []
        self.content_types: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.content_types.append(request.content_type)
        message = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in message.resource_spans:
            self.resources.append({a.key: value(a.value)
                                   for a in resource_spans.resource.attributes})
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")


def value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind)


def attrs(span: Span) -> dict[str, Any]:
    return {a.key: value(a.value) for a in span.attributes}


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    got = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", got.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield got, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def settings(tmp_path: Path, endpoint: str | None, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "GATEWAY_DATA_DIR": tmp_path, "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": 0,
        "GATEWAY_CHANNELS": "web", "GATEWAY_PROVIDER": "offline", "GATEWAY_SHUTDOWN_GRACE": 0.2,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
    }
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]  # pydantic-settings init


async def chat(tmp_path: Path, endpoint: str, *texts: str, **extra: Any) -> str:
    """One turn per text (by default one with a tool round) over the web API; returns the
    session id. The gateway is closed before returning, which flushes the batch processor to
    the receiver."""
    gateway = build_gateway(settings(tmp_path, endpoint, **extra))
    await gateway.start()
    try:
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{gateway.bound_port}/api/chat"
            for text in texts or ("remember that I like tea",):
                async with client.post(url, json={"conversation": "tea",
                                                  "text": text}) as response:
                    assert response.status == 200
                    body = await response.json()
    finally:
        await gateway.aclose()
    return str(body["session"])


def exported(tmp_path: Path, session: str, *options: str) -> list[dict[str, Any]]:
    """``gateway export SESSION --format otlp-json OPTIONS``: its lines, parsed."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["export", "--data-dir", str(tmp_path), session, "--format", "otlp-json",
                     *options]) == 0
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


async def test_export_gives_every_span_the_ids_it_had_live(
    receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    """Two turns (the first with a tool round) traced live, then the session exported: the
    export has exactly the spans the receiver got, each with the same trace id, span id,
    parent and name; a trace per turn; every parent link resolves within its trace; both
    name the gateway's version."""
    got, endpoint = receiver
    session = await chat(tmp_path, endpoint, "remember that I like tea", "thanks")
    live = {(s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name)
            for s in got.spans}
    lines = await asyncio.to_thread(exported, tmp_path, session, "--content", "full")
    export = {(s["traceId"], s["spanId"], s.get("parentSpanId", ""), s["name"])
              for line in lines for s in line["resourceSpans"][0]["scopeSpans"][0]["spans"]}
    assert export == live
    assert len(live) == 6  # turn, chat, execute_tool, chat; turn, chat
    assert len(lines) == len({trace for trace, _, _, _ in live}) == 2
    for trace in {trace for trace, _, _, _ in live}:
        spans = {span for span in live if span[0] == trace}
        ids = {span_id for _, span_id, _, _ in spans}
        assert [parent for _, _, parent, _ in spans if parent not in ids] == [""]  # the root
    version = got.resources[0]["service.version"]
    assert version
    assert {a["key"]: a["value"]["stringValue"]
            for a in lines[0]["resourceSpans"][0]["resource"]["attributes"]} == {
        "service.name": "gateway", "service.version": version}


async def test_a_turn_is_a_root_span_with_call_and_tool_children(
    receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    """Turn -> chat, execute_tool, chat: one trace, parents right, GenAI attributes set
    (gen_ai.provider.name, never gen_ai.system), and no content without the opt-in."""
    got, endpoint = receiver
    session = await chat(tmp_path, endpoint)
    assert set(got.content_types) == {"application/x-protobuf"}
    assert got.resources[0]["service.name"] == "gateway"
    spans = sorted(got.spans, key=lambda s: s.start_time_unix_nano)
    assert [s.name for s in spans] == [
        "invoke_agent gateway", "chat offline-1", "execute_tool memory_write", "chat offline-1"]
    turn, first, tool, second = spans
    assert turn.parent_span_id == b""
    assert {s.trace_id for s in spans} == {turn.trace_id}
    assert [s.parent_span_id for s in (first, second)] == [turn.span_id] * 2
    assert tool.parent_span_id == first.span_id  # the call whose answer asked for it
    assert [s.kind for s in spans] == [Span.SPAN_KIND_INTERNAL, Span.SPAN_KIND_CLIENT,
                                       Span.SPAN_KIND_INTERNAL, Span.SPAN_KIND_CLIENT]
    assert all(s.end_time_unix_nano >= s.start_time_unix_nano > 0 for s in spans)
    # The conversation as the client named it (the gateway keys it under the person).
    assert {**attrs(turn), "gateway.conversation": client_label(
        str(attrs(turn)["gateway.conversation"]))} == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "gateway",
        "gen_ai.conversation.id": session, "gateway.tenant": WEB_TENANT,
        "gateway.channel": "web", "gateway.conversation": "web:tea",
        "gateway.turn.outcome": "answered",
    }
    call = attrs(first)
    assert {k: call[k] for k in ("gen_ai.operation.name", "gen_ai.provider.name",
                                 "gen_ai.request.model", "gen_ai.conversation.id",
                                 "gateway.call", "gen_ai.response.finish_reasons")} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "offline",
        "gen_ai.request.model": "offline-1", "gen_ai.conversation.id": session,
        "gateway.call": 1, "gen_ai.response.finish_reasons": ["tool_call"],
    }
    assert attrs(second)["gateway.call"] == 2
    assert attrs(second)["gen_ai.response.finish_reasons"] == ["stop"]
    assert attrs(tool) == {"gen_ai.operation.name": "execute_tool",
                           "gen_ai.tool.name": "memory_write", "gen_ai.tool.type": "function",
                           "gen_ai.tool.call.id": attrs(tool)["gen_ai.tool.call.id"]}
    for span in spans:
        names = set(attrs(span))
        assert "gen_ai.system" not in names
        assert not names & {"gen_ai.input.messages", "gen_ai.output.messages",
                            "gen_ai.system_instructions", "gen_ai.tool.call.arguments"}
        assert span.status.code == Status.STATUS_CODE_UNSET


async def test_content_is_recorded_only_when_opted_in(
    receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    """With OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true the call spans carry the
    prompt and messages, the tool span its arguments and result."""
    got, endpoint = receiver
    await chat(tmp_path, endpoint, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true")
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in sorted(got.spans, key=lambda s: s.start_time_unix_nano):
        by_name.setdefault(span.name, []).append(attrs(span))
    first, _ = by_name["chat offline-1"]
    assert "remember that I like tea" in first["gen_ai.input.messages"]
    assert "gen_ai.system_instructions" in first
    assert '"tool_call"' in first["gen_ai.output.messages"]
    (tool,) = by_name["execute_tool memory_write"]
    assert "tea" in tool["gen_ai.tool.call.arguments"]
    assert tool["gen_ai.tool.call.result"]


async def test_a_failed_call_is_an_error_span(
    receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    """An unreachable provider ends its chat span with error.type and an ERROR status, and
    the turn span too; server.address names the provider's host."""
    got, endpoint = receiver
    closed = await _listener_port()
    gateway = build_gateway(settings(
        tmp_path, endpoint, GATEWAY_PROVIDER="openai", OPENAI_API_KEY="sk-test",
        OPENAI_BASE_URL=f"http://127.0.0.1:{closed}/v1", GATEWAY_PROVIDER_RETRIES=0,
        GATEWAY_PROVIDER_TIMEOUT=5))
    await gateway.start()
    try:
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{gateway.bound_port}/api/chat"
            async with client.post(url, json={"conversation": "x", "text": "hi"}) as response:
                await response.read()
    finally:
        await gateway.aclose()
    turn, call = sorted(got.spans, key=lambda s: s.start_time_unix_nano)
    assert (call.status.code, attrs(call)["error.type"]) == (Status.STATUS_CODE_ERROR,
                                                            "unavailable")
    assert "gen_ai.response.finish_reasons" not in attrs(call)  # no response came back
    assert (attrs(call)["server.address"], attrs(call)["server.port"]) == ("127.0.0.1", closed)
    assert turn.status.code == Status.STATUS_CODE_ERROR


async def _listener_port() -> int:
    """A loopback port with nothing listening (bound, then closed)."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    return port


def test_no_endpoint_means_no_tracer(tmp_path: Path) -> None:
    """Without an endpoint (or with OTEL_SDK_DISABLED) nothing is traced."""
    from app.compose import build_observer

    assert build_observer(settings(tmp_path, None)) is NO_OBSERVER
    assert build_observer(settings(tmp_path, "http://127.0.0.1:1",
                                   OTEL_SDK_DISABLED="true")) is NO_OBSERVER
    assert settings(tmp_path, "http://h:4318/").traces_endpoint() == "http://h:4318/v1/traces"


def test_only_http_protobuf_is_accepted(tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_PROTOCOL=grpc is refused naming the setting, not sent over HTTP."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        settings(tmp_path, "http://127.0.0.1:4317", OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    assert settings(tmp_path, "http://h:4318",
                    OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf").traces_endpoint()
