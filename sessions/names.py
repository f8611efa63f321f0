"""Validation of session ids and tenant names, and generation of new session ids.

Names reach file paths (and SQL keys), so they are checked against one strict pattern and a
length bound before any use; a bad name is refused with :class:`InvalidNameError`, never
sanitised into something else.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

from sessions.errors import InvalidNameError, SessionExistsError

T = TypeVar("T")

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


ID_RANDOM_BYTES = 6
"""Random bytes in a generated id (12 hex digits). Ids generated before had 3 (6 digits);
both match the same name pattern, so old logs read and resume as before."""
MAX_ID_TRIES = 5


def new_session_id(now: datetime | None = None) -> str:
    """A sortable id: UTC start time plus random hex, ``YYYYMMDD-HHMMSS-xxxxxxxxxxxx``."""
    moment = now or datetime.now(UTC)
    return f"{moment:%Y%m%d-%H%M%S}-{secrets.token_hex(ID_RANDOM_BYTES)}"


async def create_with_fresh_id(create: Callable[[str], Awaitable[T]],
                               new_id: Callable[[], str] = new_session_id) -> T:
    """``create(id)`` with generated ids until one is not taken: a collision (two sessions
    started in the same second drew the same suffix) is retried with a new id, not an error.
    Gives up with :class:`SessionExistsError` after :data:`MAX_ID_TRIES` taken ids."""
    for attempt in range(MAX_ID_TRIES):
        try:
            return await create(new_id())
        except SessionExistsError:
            if attempt == MAX_ID_TRIES - 1:
                raise
    raise AssertionError("unreachable")


_second_cache: tuple[int, str] = (-1, "")


def utc_iso(moment: float) -> str:
    """A Unix time as every entry's timestamp: ISO 8601, UTC, millisecond precision, ``Z``.

    Called for every append, so the date-time part is formatted once per second.
    """
    global _second_cache
    second = int(moment)
    if _second_cache[0] != second:
        _second_cache = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    millis = min(int((moment - second) * 1000), 999)
    return f"{_second_cache[1]}.{millis:03d}Z"


def utc_now_iso() -> str:
    """Timestamp used in every entry, now: :func:`utc_iso` of the wall clock."""
    return utc_iso(time.time())
