"""The OTLP/JSON encoding of spans (the OpenTelemetry protocol's JSON form, as the collector's
file exporter writes and its file receiver reads: one ``TracesData`` object per line).

Pure and dependency-free: the mapping of the protobuf ``TracesData`` to JSON as the OTLP
specification fixes it: lowerCamelCase field names, trace and span ids as hex strings, 64-bit
integers (times, ``intValue``) as decimal strings, enums as integers, attributes as a list of
``{"key", "value": AnyValue}``. The tests parse every line with opentelemetry-proto.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
STATUS_UNSET = 0
STATUS_ERROR = 2


@dataclass(frozen=True, slots=True)
class Span:
    """One span to encode; ``attributes`` hold primitives or lists of primitives."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    start_ns: int | None
    end_ns: int | None
    attributes: Mapping[str, Any]
    parent_span_id: str | None = None
    error: str | None = None


def any_value(value: Any) -> dict[str, Any]:
    """An ``AnyValue``: bool before int (a bool is an int in Python), lists as arrays."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": attributes(value)}}
    return {"stringValue": str(value)}


def attributes(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": any_value(value)} for key, value in values.items()
            if value is not None]


def span_json(span: Span) -> dict[str, Any]:
    body: dict[str, Any] = {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        "name": span.name,
        "kind": span.kind,
        "attributes": attributes(span.attributes),
        "status": ({"code": STATUS_ERROR, "message": span.error} if span.error is not None
                   else {"code": STATUS_UNSET}),
    }
    if span.parent_span_id is not None:
        body["parentSpanId"] = span.parent_span_id
    # A span without a known time keeps the proto default (0): the field is simply left out.
    if span.start_ns is not None:
        body["startTimeUnixNano"] = str(span.start_ns)
    if span.end_ns is not None:
        body["endTimeUnixNano"] = str(span.end_ns)
    return body


def traces_data(spans: Sequence[Span], resource: Mapping[str, Any],
                scope: str, version: str | None = None) -> dict[str, Any]:
    """One ``TracesData``: one resource, one instrumentation scope, these spans."""
    scope_json: dict[str, Any] = {"name": scope}
    if version is not None:
        scope_json["version"] = version
    return {"resourceSpans": [{
        "resource": {"attributes": attributes(resource)},
        "scopeSpans": [{"scope": scope_json, "spans": [span_json(s) for s in spans]}],
    }]}
