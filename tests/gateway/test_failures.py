"""Failure kinds are one enum whose members are the strings logs, metrics and session logs
have always carried, and every kind the session stores raise by name is one of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry, Counter, generate_latest

from gateway.edge.errors import (
    Failure,
    NotRecordedError,
    ProviderRateLimited,
    ProviderStreamCut,
    ProviderTimeout,
    ProviderUnavailable,
    kind_of,
)

ROOT = Path(__file__).resolve().parents[2]
WRITERS = ["sessions/errors.py", "sessions/jsonl_writer.py", "sessions/postgres/writer.py",
           "sessions/postgres/store.py"]
"""Where the session stores name the kinds their writes fail with (sessions/ imports nothing
of ours, so it spells them itself)."""


def test_members_are_the_strings_already_on_disk_and_in_metrics() -> None:
    """The kinds older logs, journals and dashboards hold read back as the same members, and
    a member written to JSON, a metric label or a log line is the same string as before."""
    assert Failure("STALE_FENCE") is Failure.FENCED
    assert Failure("NOT_FOUND") is Failure.GONE
    assert [ProviderTimeout.kind, ProviderRateLimited.kind, ProviderUnavailable.kind,
            ProviderStreamCut.kind] == ["timeout", "rate_limited", "unavailable", "stream_cut"]
    assert orjson.loads(orjson.dumps({"kind": Failure.FENCED})) == {"kind": "STALE_FENCE"}
    assert f"{Failure.STALLED} / %s" % Failure.GONE == "STALLED / NOT_FOUND"
    registry = CollectorRegistry()
    counter = Counter("failures", "test", ["kind"], registry=registry)
    counter.labels(kind=Failure.TIMEOUT).inc()
    assert 'failures_total{kind="timeout"} 1.0' in generate_latest(registry).decode()


def test_a_fenced_refusal_is_known_by_its_kind_from_either_side() -> None:
    """A refusal the store reported as a plain string and one raised with the member are the
    same kind."""
    assert NotRecordedError("s1", "STALE_FENCE").fenced
    assert NotRecordedError("s1", Failure.FENCED).fenced
    assert kind_of(NotRecordedError("s1", "STALE_FENCE")) == Failure.FENCED


def test_every_kind_a_session_store_names_is_a_member() -> None:
    """Each upper-case name the stores and their errors spell (the kinds of their write
    failures) is a :class:`Failure`; a new one has to be added to the enum."""
    named: set[str] = set()
    for path in WRITERS:
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and re.fullmatch(r"[A-Z][A-Z_]{2,}", node.value)):
                named.add(node.value)
    assert named >= {"STALE_FENCE", "STALLED", "CLOSED", "NOT_FOUND"}  # the scan sees them
    assert sorted(named - {member.value for member in Failure}) == []
