"""Log context: fields (tenant, channel, conversation, session, call; and the turn's
``trace_id`` and the ``span_id`` of the span running, as the trace of that turn has them)
bound for a stretch of work and added to every log record written inside it.

The standard library's ``logging`` plus one ``contextvars.ContextVar`` (no structlog): every
library's logger already goes through ``logging``, and a context variable follows the work
across ``await`` and into tasks started inside it, never into a neighbour's turn. The shell's
log formatter reads :func:`current`; the core only binds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from types import MappingProxyType

FIELDS = ("tenant", "channel", "conversation", "session", "call")
"""The context fields, in the order the formatters print them."""
TRACE_FIELDS = ("trace_id", "span_id")
"""The trace context, on JSON log lines only (:mod:`sessions.traces` derives the ids, so a
line joins its live trace and its ``gateway export`` record)."""

_EMPTY: Mapping[str, str] = MappingProxyType({})
_context: ContextVar[Mapping[str, str]] = ContextVar("gateway_log_context", default=_EMPTY)


def current() -> Mapping[str, str]:
    """The fields bound where the caller runs (read-only)."""
    return _context.get()


def extend(**fields: object) -> None:
    """Add ``fields`` for the rest of the enclosing :func:`bound` block (whose end takes them
    away with its own): for a field known only partway through the block."""
    added = {name: str(value) for name, value in fields.items() if value is not None}
    if added:
        _context.set(MappingProxyType({**_context.get(), **added}))


@contextlib.contextmanager
def bound(**fields: object) -> Iterator[None]:
    """Add ``fields`` (``None`` values skipped) to the log context until the block ends."""
    added = {name: str(value) for name, value in fields.items() if value is not None}
    token = _context.set(MappingProxyType({**_context.get(), **added}))
    try:
        yield
    finally:
        _context.reset(token)
