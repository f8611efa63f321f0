"""Logging set-up: readable text by default, one JSON object per line with
``GATEWAY_LOG_FORMAT=json``; every configured secret is redacted from every record.

The standard library's ``logging`` with the context fields of :mod:`gateway.edge.logctx` (tenant,
channel, conversation, session, call), bound by the agent loop for the duration of a turn: a
JSON line carries them as top-level keys, a text line as ``key=value`` pairs at its end.

JSON lines: ``ts`` (ISO 8601, UTC, milliseconds, ``Z``), ``level``, ``logger``, ``message``,
the context fields that are bound, ``trace_id`` and ``span_id`` while a turn runs (the ids its
trace has, live or exported: :mod:`sessions.traces`), and ``exc`` for a traceback.

Client libraries (HTTP clients, the provider and platform SDKs, database drivers, the
OpenTelemetry exporter) are held at WARNING whatever ``GATEWAY_LOG_LEVEL`` says: at DEBUG they
write whole request bodies (user text, memory) and URLs that carry the Telegram bot token.
An operator who needs them names them in ``GATEWAY_LOG_LEVELS`` (``httpx2=DEBUG,openai=INFO``).
The gateway's own loggers are named after their modules (``logging.getLogger(__name__)``:
``gateway.*``, ``channels.*``, ``providers.*``, ``coordination.*``, ``toolsets.*``,
``sessions.*``, ``app.*``), take the configured level from the root, and can be turned up by
package or module the same way (``channels.telegram=DEBUG``). They never write secrets or
message content at INFO or above.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import orjson

from gateway.edge import logctx

if TYPE_CHECKING:
    from app.config import Settings

REDACTED = "***"

QUIET_LOGGERS = (
    "httpx", "httpx2", "httpcore", "httpcore2", "urllib3", "requests",
    "anthropic", "openai", "telegram", "slack_bolt", "slack_sdk",
    "aiohttp.access", "aiohttp.client", "asyncpg", "redis", "opentelemetry", "mcp",
)
"""Held at WARNING unless ``GATEWAY_LOG_LEVELS`` names them."""


class RedactSecrets(logging.Filter):
    """Replaces any configured secret value found in a record's final message."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        clean = message
        for secret in self.secrets:
            clean = clean.replace(secret, REDACTED)
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            for secret in self.secrets:
                text = text.replace(secret, REDACTED)
            record.exc_text = text
            record.exc_info = None
        if clean != message:
            record.msg, record.args = clean, None
        return True


class BindContext(logging.Filter):
    """Copies the bound context fields onto the record (as ``record.context``) when it is
    handled, so a formatter run later or elsewhere still sees the turn it came from."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "context"):
            record.context = logctx.current()
        return True


def utc_timestamp(created: float) -> str:
    """``2026-12-01T14:14:35.123Z``: ISO 8601, UTC, milliseconds."""
    moment = datetime.fromtimestamp(created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _context(record: logging.LogRecord) -> Mapping[str, str]:
    context = getattr(record, "context", None)
    return context if isinstance(context, Mapping) else {}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "ts": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _context(record)
        for name in (*logctx.FIELDS, *logctx.TRACE_FIELDS):
            if name in context:
                body[name] = context[name]
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            body["exc"] = record.exc_text
        return orjson.dumps(body).decode()


class TextFormatter(logging.Formatter):
    """``<UTC time> LEVEL logger: message  key=value ...`` (the bound context at the end)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_timestamp(record.created)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = _context(record)
        pairs = [f"{name}={context[name]}" for name in logctx.FIELDS if name in context]
        if not pairs:
            return text
        head, sep, tail = text.partition("\n")  # keep a traceback below the context
        return f"{head}  {' '.join(pairs)}{sep}{tail}"


def parse_levels(text: str) -> dict[str, str]:
    """``GATEWAY_LOG_LEVELS``: ``logger=LEVEL`` pairs separated by commas."""
    levels: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, level = item.partition("=")
        level = level.strip().upper()
        if not sep or not name.strip() or level not in logging.getLevelNamesMapping():
            raise ValueError(f"{item.strip()!r} is not logger=LEVEL (DEBUG, INFO, WARNING...)")
        levels[name.strip()] = level
    return levels


def configure(fmt: str, level: str, secrets: Iterable[str],
              levels: Mapping[str, str] | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(BindContext())
    handler.addFilter(RedactSecrets(secrets))
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for name, chosen in (levels or {}).items():
        logging.getLogger(name).setLevel(chosen)


def configure_from(settings: Settings, level: str | None = None,
                   secrets: Iterable[str] = ()) -> None:
    """:func:`configure` from the settings (``level`` overrides ``GATEWAY_LOG_LEVEL``;
    ``secrets`` are redacted too, e.g. the MCP servers' headers and env values)."""
    configure(settings.log_format, level or settings.log_level,
              [*settings.secrets(), *secrets], parse_levels(settings.log_levels))
