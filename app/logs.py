"""Logging set-up: readable text by default, one JSON object per line with
``GATEWAY_LOG_FORMAT=json``; every configured secret is redacted from every record."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

import orjson

REDACTED = "***"


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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            body["exc"] = record.exc_text
        return orjson.dumps(body).decode()


def configure(fmt: str, level: str, secrets: Iterable[str]) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactSecrets(secrets))
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Client libraries log request URLs, and Telegram's URLs carry the bot token.
    for noisy in ("httpx", "httpcore", "telegram", "slack_bolt", "slack_sdk", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
