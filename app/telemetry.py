"""Live OpenTelemetry traces: the observer (:mod:`gateway.edge.observe`) backed by the
OpenTelemetry SDK, exported over OTLP/HTTP by a batch processor on its own thread.

Chosen by the composition root when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and ``OTEL_SDK_DISABLED`` is not ``true``; the
exporter reads the other standard variables itself (``OTEL_EXPORTER_OTLP_HEADERS``,
``..._TIMEOUT``, ``..._COMPRESSION``, certificates), and the resource reads
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (service name ``gateway`` and
``service.version`` the gateway's by default).

One trace per turn. Its ids are derived from the log (:mod:`sessions.traces`): the trace and
the turn's span from the session and the message the turn answers, a call's span from its call
entry's number, a tool call's from that and its tool-use id. So ``gateway export --format
otlp-json`` gives every span the id it had here, and a log line written during the turn
carries them too. (A call the log refused has no entry: its span, and its tool calls', get
random ids.)

Spans (GenAI semantic conventions 1.37+, attribute builders shared with the file export in
:mod:`sessions.genai`):

* a turn: ``invoke_agent gateway``, kind INTERNAL, ``gen_ai.operation.name=invoke_agent``,
  ``gen_ai.agent.name``, ``gen_ai.conversation.id`` (the session), ``gateway.tenant``,
  ``gateway.channel``, ``gateway.conversation``, ``gateway.turn.outcome``;
* each provider call, a child: ``chat {model}``, kind CLIENT, ``gen_ai.provider.name`` (never
  the deprecated ``gen_ai.system``), ``gen_ai.request.*``, ``gen_ai.response.model``,
  ``gen_ai.response.id``, ``gen_ai.response.finish_reasons``, ``gen_ai.usage.*``,
  ``server.address``/``server.port``, ``gateway.call``; when it failed, ``error.type``, an
  ERROR status and no finish reasons (no response came back);
* each tool call, a child of the call whose answer asked for it: ``execute_tool {name}``, kind
  INTERNAL, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type=function``.

Content (system instructions, input and output messages, tool definitions, tool arguments and
results) is recorded only with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, as
the conventions make it opt-in: it is what people wrote to the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from app.version import version
from gateway.edge.observe import (
    CallHandle,
    CallInfo,
    CallResult,
    ToolHandle,
    ToolInfo,
    TurnHandle,
    TurnInfo,
)
from sessions import genai, traces

AGENT_NAME = "gateway"
SCOPE = "gateway"


class DerivedIds(IdGenerator):
    """Gives the span being started the ids the gateway derived for it (:meth:`given`), and
    random ones to any other. Spans are started on the event loop's thread, one at a time, so
    the ids given are taken by the very next ``start_span``."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._trace: int | None = None
        self._span: int | None = None

    @contextlib.contextmanager
    def given(self, trace_id: str | None, span_id: str | None) -> Iterator[None]:
        self._trace = int(trace_id, 16) if trace_id else None
        self._span = int(span_id, 16) if span_id else None
        try:
            yield
        finally:
            self._trace = self._span = None

    def generate_trace_id(self) -> int:
        return self._trace if self._trace is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        return self._span if self._span is not None else self._random.generate_span_id()


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """What the spans say beyond the call itself."""

    capture_content: bool = False
    server_address: str | None = None
    server_port: int | None = None


class OtelObserver:
    """A :class:`~gateway.edge.observe.TurnObserver` writing OpenTelemetry spans.

    Spans are ended on the event loop (cheap: the batch processor only queues them); export
    runs on the processor's thread. :meth:`aclose` flushes and shuts the provider down off the
    loop, once."""

    def __init__(self, provider: TracerProvider, options: TraceOptions,
                 ids: DerivedIds | None = None) -> None:
        self.provider = provider
        self.options = options
        self.tracer = provider.get_tracer(SCOPE)
        self.ids = ids or DerivedIds()
        self._closed = False

    def turn_started(self, turn: TurnInfo) -> TurnHandle:
        inbound = turn.inbound
        with self.ids.given(
            None if inbound is None else traces.trace_id(turn.tenant, turn.session, inbound),
            None if inbound is None else traces.turn_span_id(turn.tenant, turn.session, inbound),
        ):
            span = self.tracer.start_span(
                f"{genai.OPERATION_AGENT} {AGENT_NAME}", kind=SpanKind.INTERNAL,
                context=trace.set_span_in_context(trace.INVALID_SPAN),  # a root: a trace a turn
                attributes={
                    "gen_ai.operation.name": genai.OPERATION_AGENT,
                    "gen_ai.agent.name": AGENT_NAME,
                    "gen_ai.conversation.id": turn.session,
                    "gateway.tenant": turn.tenant,
                    "gateway.channel": turn.channel,
                    "gateway.conversation": turn.conversation,
                })
        return _TurnSpan(self, span, turn)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Joins the export thread after its last batch: blocking, so off the event loop.
        await asyncio.to_thread(self.provider.shutdown)


class _TurnSpan:
    def __init__(self, owner: OtelObserver, span: Span, turn: TurnInfo) -> None:
        self.owner, self.span, self.turn = owner, span, turn
        self.context = trace.set_span_in_context(span)
        # The call whose answer the next tool calls come from: its entry and its span's
        # context (tool spans are its children).
        self._call: tuple[int | None, Any] = (None, self.context)

    def call_started(self, call: CallInfo) -> CallHandle:
        options = self.owner.options
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": genai.OPERATION_CHAT,
            "gen_ai.provider.name": call.provider,
            "gen_ai.request.model": call.model,
            "gen_ai.conversation.id": self.turn.session,
            "gateway.call": call.index,
            **genai.request_attributes(call.params),
        }
        if options.server_address:
            attrs["server.address"] = options.server_address
            if options.server_port is not None:
                attrs["server.port"] = options.server_port
        attrs.update(genai.call_content(_level(options), call.system, call.messages,
                                        call.tools, None))
        span_id = None if call.entry is None else traces.call_span_id(
            self.turn.tenant, self.turn.session, call.entry)
        with self.owner.ids.given(None, span_id):
            span = self.owner.tracer.start_span(
                f"{genai.OPERATION_CHAT} {call.model}", kind=SpanKind.CLIENT,
                context=self.context, attributes=_clean(attrs))
        self._call = (call.entry, trace.set_span_in_context(span))
        return _CallSpan(span, options.capture_content)

    def tool_started(self, tool: ToolInfo) -> ToolHandle:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": genai.OPERATION_TOOL,
            "gen_ai.tool.name": tool.name,
            "gen_ai.tool.call.id": tool.call_id,
            "gen_ai.tool.type": "function",
        }
        if self.owner.options.capture_content:
            attrs["gen_ai.tool.call.arguments"] = genai.as_json(dict(tool.arguments))
        entry, parent = self._call
        span_id = None if entry is None else traces.tool_span_id(
            self.turn.tenant, self.turn.session, entry, tool.call_id)
        with self.owner.ids.given(None, span_id):
            span = self.owner.tracer.start_span(
                f"{genai.OPERATION_TOOL} {tool.name}", kind=SpanKind.INTERNAL,
                context=parent, attributes=attrs)
        return _ToolSpan(span, self.owner.options.capture_content)

    def finished(self, status: str, latency: float) -> None:
        self.span.set_attribute("gateway.turn.outcome", status)
        if status in ("error", "apologised"):
            self.span.set_status(Status(StatusCode.ERROR, status))
            self.span.set_attribute("error.type", status)
        self.span.end()


class _CallSpan:
    def __init__(self, span: Span, capture_content: bool) -> None:
        self.span, self.capture_content = span, capture_content

    def finished(self, result: CallResult) -> None:
        span = self.span
        if result.error is not None:  # no response came back: no finish reasons either
            span.set_attribute("error.type", result.error)
            span.set_status(Status(StatusCode.ERROR, result.error))
            span.end()
            return
        attrs: dict[str, Any] = {
            "gen_ai.response.id": result.response_id,
            "gen_ai.response.model": result.response_model,
            **genai.usage_attributes(result.usage),
        }
        if result.message is not None:
            reason = genai.answer_reason(result.message, result.stop_reason)
            attrs["gen_ai.response.finish_reasons"] = [reason]
            attrs.update(genai.call_content("full" if self.capture_content else "none",
                                            None, None, None, (result.message, reason)))
        span.set_attributes(_clean(attrs))
        span.end()


class _ToolSpan:
    def __init__(self, span: Span, capture_content: bool) -> None:
        self.span, self.capture_content = span, capture_content

    def finished(self, result: str, *, is_error: bool) -> None:
        if self.capture_content:
            self.span.set_attribute("gen_ai.tool.call.result", result)
        if is_error:
            self.span.set_attribute("error.type", "tool_error")
            self.span.set_status(Status(StatusCode.ERROR, "tool_error"))
        self.span.end()


def _level(options: TraceOptions) -> str:
    """The content level of live spans: the GenAI conventions' opt-in is all or nothing."""
    return "full" if options.capture_content else "none"


def _clean(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes without the unknown (None) ones: the SDK refuses None values."""
    return {key: value for key, value in attrs.items() if value is not None}


def otlp_observer(exporter: SpanExporter, options: TraceOptions,
                  *, schedule_delay_millis: float | None = None) -> OtelObserver:
    """An observer exporting through ``exporter`` with a batch processor."""
    resource = Resource.create()  # reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": AGENT_NAME}))
    if "service.version" not in resource.attributes:
        resource = resource.merge(Resource({"service.version": version()}))
    ids = DerivedIds()
    provider = TracerProvider(resource=resource, id_generator=ids)
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_millis))
    return OtelObserver(provider, options, ids)
