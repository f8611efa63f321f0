"""The start-up credential check's error: what the provider answered, in its own words, with
no key in them.

:meth:`providers.sdk.SdkProvider.check` lists the models (one cheap authenticated request);
when that fails, :func:`check_error` turns the SDK's exception into a
:class:`~gateway.edge.errors.ProviderError` whose message is the status, the error's type and
the API's own message (``invalid x-api-key``, ``Incorrect API key provided: sk-...``), so the
operator reads why at once. Keys are cut out of it: the configured one wherever it appears,
and anything shaped like a provider or platform key (OpenAI quotes a masked key back).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.edge.errors import ProviderError, ProviderTimeout, ProviderUnavailable

MESSAGE_LIMIT = 200
"""Characters of the API's message kept (one line on a terminal)."""

_KEY_SHAPED = re.compile(r"\b(?:sk|xox[a-z]|xapp)-[\w*\-]+(?:\.[\w*\-]+)*")
"""OpenAI's and Anthropic's keys (``sk-...``, masked or not) and Slack's tokens."""


def check_error(provider: str, exc: Exception, *, timeout: type[Exception],
                connection: type[Exception], status: type[Exception],
                key: str | None) -> ProviderError:
    """The error for a failed check, from the SDK's exception ``exc`` (its timeout, connection
    and status classes given); the message never holds ``key``."""
    if isinstance(exc, timeout):
        return ProviderTimeout(f"{provider}: no answer within the timeout")
    if isinstance(exc, connection):
        return ProviderUnavailable(f"{provider}: could not connect")
    code = getattr(exc, "status_code", None)
    if isinstance(exc, status) and isinstance(code, int):
        kind, said = _said(getattr(exc, "body", None))
        message = f"{provider}: HTTP {code}" + (f" {kind}" if kind else "")
        if said:
            message += f": {redact(said, key)}"
        error_class = ProviderUnavailable if code >= 500 else ProviderError
        return error_class(message, status=code)
    return ProviderError(f"{provider}: {type(exc).__name__}")


def redact(text: str, key: str | None) -> str:
    """``text`` on one line, at most :data:`MESSAGE_LIMIT` characters, without ``key`` or
    anything shaped like a key."""
    if key:
        text = text.replace(key, "[key]")
    text = _KEY_SHAPED.sub("[key]", " ".join(text.split()))
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 1] + "…"


def _said(body: Any) -> tuple[str | None, str | None]:
    """(error type or code, message) from an API error body: Anthropic's ``{"type": "error",
    "error": {...}}``, or OpenAI's error object (the SDK hands over its ``error`` member)."""
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    if not isinstance(body, Mapping):
        return None, None
    kind = body.get("code") or body.get("type")
    message = body.get("message")
    return (str(kind) if kind else None,
            str(message) if isinstance(message, str) and message.strip() else None)
