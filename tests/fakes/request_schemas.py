"""Request bodies checked the way the real APIs check them, against the official SDKs' types.

The ``anthropic`` and ``openai`` packages ship their create-params as TypedDicts
(``MessageCreateParams*``, ``CompletionCreateParams*``). :func:`violations` validates a body
against the right one with pydantic, strictly (required keys present, no coercion: a string is
not a number, ``True`` is not ``1``), walks every lazily validated list (the SDKs type lists as
``Iterable``, which pydantic checks only when iterated) and refuses top-level keys the type
does not name, as the APIs answer "Extra inputs are not permitted". The fake provider servers
answer 400 with the first violation, so a body the real API would reject fails a test.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import Any, Literal

from anthropic.types import message_create_params
from openai.types.chat import completion_create_params
from pydantic import TypeAdapter, ValidationError

ApiName = Literal["anthropic", "openai"]

_TYPES: dict[tuple[ApiName, bool], Any] = {
    ("anthropic", False): message_create_params.MessageCreateParamsNonStreaming,
    ("anthropic", True): message_create_params.MessageCreateParamsStreaming,
    ("openai", False): completion_create_params.CompletionCreateParamsNonStreaming,
    ("openai", True): completion_create_params.CompletionCreateParamsStreaming,
}


@cache
def _adapter(api: ApiName, stream: bool) -> TypeAdapter[Any]:
    return TypeAdapter(_TYPES[api, stream])


def _keys(api: ApiName, stream: bool) -> frozenset[str]:
    kind = _TYPES[api, stream]
    return frozenset(kind.__required_keys__ | kind.__optional_keys__)


def violations(api: ApiName, body: Mapping[str, Any]) -> list[str]:
    """What the real API would refuse in ``body`` (``path: message``), or nothing."""
    stream = body.get("stream") is True
    found = [f"{key}: Extra inputs are not permitted"
             for key in sorted(set(body) - _keys(api, stream))]
    try:
        _force(_adapter(api, stream).validate_python(dict(body), strict=True))
    except ValidationError as exc:
        found += [f"{'.'.join(str(p) for p in error['loc']) or '(body)'}: {error['msg']}"
                  for error in exc.errors()]
    return found


def _force(value: Any) -> None:
    """Iterate every lazily validated list, so its items are checked now."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Iterator):  # pydantic's lazy validator of an ``Iterable`` field
            stack.extend(list(item))
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, Iterable) and not isinstance(item, str | bytes):
            stack.extend(item)
