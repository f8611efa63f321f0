"""Pieces both SDK providers need: tool-input parsing and transport-error translation."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson

from gateway.errors import ProviderError, ProviderStreamCut, ProviderTimeout


def parse_tool_input(raw: str) -> dict[str, Any]:
    """Tool input from its JSON text; ``{}`` when empty, ``{"_raw": raw}`` when not an object
    (the model's text is kept, never dropped, and the tool reports the bad input)."""
    if not raw.strip():
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": raw}


def stream_transport_error(provider: str, exc: httpx2.TransportError) -> ProviderError:
    """A transport failure during a stream (the SDKs may let these escape unwrapped)."""
    if isinstance(exc, httpx2.TimeoutException):
        return ProviderTimeout(f"{provider}: the stream stalled past the timeout")
    return ProviderStreamCut(f"{provider}: the stream broke off")
