"""Validation of session ids and tenant names, and generation of new session ids.

Names reach file paths (and SQL keys), so they are checked against one strict pattern and a
length bound before any use; a bad name is refused with :class:`InvalidNameError`, never
sanitised into something else.
"""

from __future__ import annotations

import re
import secrets
import time
from datetime import UTC, datetime

from sessions.errors import InvalidNameError

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME_LENGTH = 128
DEFAULT_TENANT = "default"


def validate_name(value: object, what: str = "session id") -> str:
    """Return ``value`` if it is a safe name, else raise :class:`InvalidNameError`."""
    if not isinstance(value, str):
        raise InvalidNameError(f"{what} must be a string")
    if not value:
        raise InvalidNameError(f"{what} is empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidNameError(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if NAME_PATTERN.fullmatch(value) is None or ".." in value:
        raise InvalidNameError(
            f"{what} {value[:40]!r} is not allowed (use letters, digits, '.', '_', '-'; no '..')"
        )
    return value


def validate_session_id(value: object) -> str:
    return validate_name(value, "session id")


def validate_tenant(value: object) -> str:
    return validate_name(value, "tenant")


def new_session_id(now: datetime | None = None) -> str:
    """A sortable id: UTC start time plus random hex, like the seed project's ids."""
    moment = now or datetime.now(UTC)
    return f"{moment:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


_second_cache: tuple[int, str] = (-1, "")


def utc_now_iso() -> str:
    """Timestamp used in every entry: ISO 8601, UTC, millisecond precision, ``Z`` suffix.

    Called for every append, so the date-time part is formatted once per second.
    """
    global _second_cache
    now = time.time()
    second = int(now)
    if _second_cache[0] != second:
        _second_cache = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    millis = min(int((now - second) * 1000), 999)
    return f"{_second_cache[1]}.{millis:03d}Z"
