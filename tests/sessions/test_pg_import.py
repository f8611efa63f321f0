"""Cutting JSONL logs into rows for the PostgreSQL store (pure: no database needed)."""

from __future__ import annotations

import pytest

from sessions.errors import CorruptHeaderError, EmptySessionError, SessionReadError
from sessions.postgres.importer import plan_import


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", EmptySessionError),
        (b'{"type":"session","id":"x"', EmptySessionError),
        (b'{"type":"message"}\n', CorruptHeaderError),
        (b'{"type":"session","version":3,"seq":0}\n{"type":"message","seq":2}\n', SessionReadError),
        (b'{"type":"session","version":3,"seq":0}\n{"type":"message","seq":0}\n', SessionReadError),
    ],
)
def test_plan_import_refuses_unreadable_logs(data: bytes, error: type[Exception]) -> None:
    """Empty logs, a missing header and a seq gap or duplicate are refused before any write."""
    with pytest.raises(error):
        plan_import(data)


def test_plan_import_skips_a_torn_last_line_only() -> None:
    """An unfinished or unparsable last line is skipped; a bad middle line is kept verbatim."""
    head = b'{"type":"session","version":2}\n'
    middle = b"not json\n"
    last = b'{"type":"message","message":{"role":"user","content":"x"}}\n'
    plan = plan_import(head + middle + last + b'{"type":"mess')
    assert ([(s, k, line) for s, k, line in plan.rows], plan.torn) == (
        [(0, "session", head[:-1]), (1, None, middle[:-1]), (2, "message", last[:-1])],
        b'{"type":"mess',
    )
    assert plan_import(head + last + b"{broken\n").torn == b"{broken\n"
