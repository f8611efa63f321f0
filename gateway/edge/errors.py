"""Errors of the gateway (the sessions package has its own tree in ``sessions.errors``).

::

    GatewayError
    ├── ConfigError             a setting is missing or invalid (named, never its value)
    ├── ProviderError           a provider call failed after the SDK's own retries
    │   ├── ProviderTimeout     no answer (or the stream stalled) within the bound
    │   ├── ProviderRateLimited 429 from the provider
    │   ├── ProviderUnavailable 5xx / 529 overloaded / connection refused
    │   └── ProviderStreamCut   the stream ended before its final event
    ├── TranscriptionError      a voice note could not be transcribed (the person is told)
    ├── ToolError               a tool failed; its message goes back to the model as a tool_result
    ├── ChannelError            a channel could not start or send
    ├── NotRecordedError        the session log refused a write the turn needs (closed, broken,
    │                           fenced off): the message never joins the conversation
    └── UnavailableError        an inbound message could not be durably recorded (store or
                                coordination down): not acknowledged, the platform retries

Third-party exceptions are translated at the seam with ``raise ... from exc``.
"""

from __future__ import annotations

import errno
from typing import Literal


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """A setting is missing or invalid. Messages name the setting, never a secret value."""


class ProviderError(GatewayError):
    """A provider call failed. ``kind`` is short and safe to log and to record in the log."""

    kind = "provider_error"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ProviderTimeout(ProviderError):
    kind = "timeout"


class ProviderRateLimited(ProviderError):
    kind = "rate_limited"


class ProviderUnavailable(ProviderError):
    kind = "unavailable"


class ProviderStreamCut(ProviderError):
    kind = "stream_cut"


class TranscriptionError(GatewayError):
    """Transcription failed. ``kind`` is short and safe to log; never the audio or its text."""

    def __init__(self, message: str, *, kind: str = "transcription_error") -> None:
        super().__init__(message)
        self.kind = kind


class ToolError(GatewayError):
    """A tool could not do what was asked; reported to the model, the turn goes on."""


class ChannelError(GatewayError):
    """A channel failed to start or to deliver a reply."""


FENCED = "STALE_FENCE"
"""The write-failure kind of a writer whose fencing token was superseded (as
:class:`sessions.errors.StaleWriterError` reports it): another worker owns the session now."""


class NotRecordedError(GatewayError):
    """The session's writer refused what had to be recorded; nothing of it joined the
    conversation (memory never runs ahead of the log), and the turn that needed it ends.

    ``kind`` is the refusal's kind (safe to log); :attr:`fenced` is true when another worker
    owns the session now (a superseded fencing token), so the work belongs to that worker.
    """

    def __init__(self, session_id: str, kind: str) -> None:
        super().__init__(f"session {session_id}: the log refused the write ({kind})")
        self.session_id = session_id
        self.kind = kind

    @property
    def fenced(self) -> bool:
        return self.kind == FENCED


RETRY_AFTER = 5
"""Seconds a platform is asked to wait (``Retry-After``) before delivering a refused message
again."""


class UnavailableError(GatewayError):
    """An inbound message could not be durably recorded, so it is not acknowledged.

    ``what`` names the part that is down: ``store`` (the session store or the owed journal) or
    ``coordination`` (Redis). Channels answer ``503 {"error": <public>}`` with
    ``Retry-After: RETRY_AFTER`` (Slack, webhooks, the web API) or hold their offset (Telegram
    long polling), so the platform delivers the message again. ``kind`` is a short cause, safe
    to log.
    """

    def __init__(self, what: Literal["store", "coordination"], kind: str) -> None:
        super().__init__(f"{what} unavailable ({kind})")
        self.what = what
        self.kind = kind

    @property
    def public(self) -> str:
        """What a client is told (no cause: that is for the operator's log)."""
        return f"{self.what} unavailable"


def kind_of(exc: BaseException) -> str:
    """A failure's kind, safe to log and count: the error's own ``kind`` (our errors), the errno
    name of an ``OSError`` (``ENOSPC``), else the exception's type name."""
    kind = getattr(exc, "kind", None)
    if isinstance(kind, str):
        return kind
    if isinstance(exc, OSError) and exc.errno:
        return errno.errorcode.get(exc.errno, type(exc).__name__)
    return type(exc).__name__
