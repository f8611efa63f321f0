"""Pieces both SDK providers need: tool-input parsing and transport-error translation."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx2

from gateway.edge.errors import ProviderError, ProviderStreamCut, ProviderTimeout


def parse_tool_input(raw: str) -> dict[str, Any]:
    """Tool input from its JSON text, exactly; ``{}`` when empty, ``{"_raw": raw}`` when it is
    not an object the provider can be sent back (the model's text is kept, never dropped, and
    the tool reports the bad input).

    Python's parser, not orjson's: orjson reads an integer past 64 bits as a float, so the
    next request would carry a number the model never wrote. NaN, the infinities and lone
    surrogates are refused: the SDKs cannot send them back.
    """
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw, parse_constant=_refuse, parse_float=_finite)
    except (ValueError, RecursionError):
        return {"_raw": raw}
    if not isinstance(value, dict) or not _sendable(value):
        return {"_raw": raw}
    return value


def _refuse(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


def _sendable(value: Any) -> bool:
    """False when a string (or key) inside holds a lone surrogate (not UTF-8)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def stream_transport_error(provider: str, exc: httpx2.TransportError) -> ProviderError:
    """A transport failure during a stream (the SDKs may let these escape unwrapped)."""
    if isinstance(exc, httpx2.TimeoutException):
        return ProviderTimeout(f"{provider}: the stream stalled past the timeout")
    return ProviderStreamCut(f"{provider}: the stream broke off")
