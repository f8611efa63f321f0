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

Every failure has a short **kind**, safe to log, to count (a metric label) and to record in
the log: one of :class:`Failure` (the fixed ones, all here), or a name the failure brings
with it (an errno name such as ``ENOSPC``, a PostgreSQL SQLSTATE, an exception's type name:
:func:`kind_of`).
"""

from __future__ import annotations

import errno
from enum import StrEnum
from typing import Literal


class Failure(StrEnum):
    """The fixed failure kinds. Each member *is* its string (a :class:`~enum.StrEnum`), so
    logs, metric labels, session logs and journals carry exactly the strings they always did,
    and a kind read back from them compares equal to its member."""

    # A session write (gateway_persist_failures_total{kind}, a ``gap`` entry, a
    # NotRecordedError). sessions/ depends on nothing of ours, so its stores spell these
    # themselves; tests/gateway/test_failures.py checks that each is a member.
    FENCED = "STALE_FENCE"
    """The writer's fencing token was superseded: another worker owns the session now."""
    GONE = "NOT_FOUND"
    """The session was deleted (erased) under its writer."""
    CLOSED = "CLOSED"
    BROKEN = "BROKEN"
    """Earlier entries were lost, so nothing after them may be written."""
    BACKLOG_FULL = "BACKLOG_FULL"
    STALLED = "STALLED"
    """The disk has not finished a write within the persist timeout (appends go on)."""
    SEQ_CONFLICT = "SEQ_CONFLICT"
    CONNECTION = "CONNECTION"
    """The database could not be reached."""
    POSTGRES = "POSTGRES"
    """The database refused without a SQLSTATE."""
    ENCODE = "ENCODE"
    """An entry the log's encoder refused (a store bug: encoding is total by contract)."""
    TIMEOUT = "timeout"
    """A bound ran out: a session write, a provider call, a transcription, a platform call."""
    UNKNOWN = "?"

    # A provider call (ProviderError.kind, an ``outcome`` entry's error), a transcription.
    PROVIDER_ERROR = "provider_error"
    RATE_LIMITED = "rate_limited"
    """429 from a provider or a platform."""
    UNAVAILABLE = "unavailable"
    """5xx, 529 or no connection; a platform update the store could not record."""
    STREAM_CUT = "stream_cut"
    TRANSCRIPTION_ERROR = "transcription_error"

    # A platform (gateway_channel_errors_total{kind}, a channel's health).
    CONFLICT = "conflict"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    BAD_REQUEST = "bad_request"
    NETWORK = "network"
    TELEGRAM = "telegram"
    """Any other Telegram Bot API error."""
    ERROR = "error"
    """Anything else a platform call raised."""
    API_ERROR = "api_error"
    """A Slack Web API error without a well-formed error code."""
    CLIENT = "client"
    HTML_REFUSED = "html_refused"
    WEBHOOK_SECRET = "webhook_secret"
    DELIVER = "deliver"
    """Handing a platform update to the gateway raised."""
    STALL = "stall"
    CRASHED = "crashed"
    BAD_ID = "bad_id"
    MALFORMED = "malformed"

    # Coordination.
    BACKLOG = "backlog"
    """The owed journal's unwritten lines passed their bound."""


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """A setting is missing or invalid. Messages name the setting, never a secret value."""


class ProviderError(GatewayError):
    """A provider call failed. ``kind`` is short and safe to log and to record in the log."""

    kind: str = Failure.PROVIDER_ERROR

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ProviderTimeout(ProviderError):
    kind = Failure.TIMEOUT


class ProviderRateLimited(ProviderError):
    kind = Failure.RATE_LIMITED


class ProviderUnavailable(ProviderError):
    kind = Failure.UNAVAILABLE


class ProviderStreamCut(ProviderError):
    kind = Failure.STREAM_CUT


class TranscriptionError(GatewayError):
    """Transcription failed. ``kind`` is short and safe to log; never the audio or its text."""

    def __init__(self, message: str, *, kind: str = Failure.TRANSCRIPTION_ERROR) -> None:
        super().__init__(message)
        self.kind = kind


class ToolError(GatewayError):
    """A tool could not do what was asked; reported to the model, the turn goes on."""


class ChannelError(GatewayError):
    """A channel failed to start or to deliver a reply."""


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
        return self.kind == Failure.FENCED


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
