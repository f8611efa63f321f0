"""Prompt drift: how each section of the system prompt changed over a session. Pure.

:func:`drift` walks a replay's prompt versions in order and, for every section name, emits one
:class:`DriftPoint` per version from the section's first appearance on. v1/v2 logs store the
prompt inline; replay names that single section ``"prompt"``.

Definitions (``docs/drift.md`` has worked examples). For a section ``s`` and prompt version
``i``, ``text_i`` is the section's text in version ``i``; a section that is absent from a
version (removed, or its text is not in the log) counts as the empty string and its point has
``present=False``. Two sections of one version with the same name are joined with
:data:`~sessions.records.PROMPT_JOINER`.

``size``
    UTF-8 bytes of ``text_i`` (0 when absent).
``bytes_added`` / ``bytes_removed``
    UTF-8 bytes of ``text_i`` / ``text_{i-1}`` left unmatched by a two-level diff: a
    :class:`difflib.SequenceMatcher` over lines (``keepends=True``), then, inside every
    ``replace`` run of lines, a character-level matcher over that run's text. Both matchers run
    with ``autojunk=False`` (difflib's auto-junk heuristic would otherwise discard common
    characters such as spaces in texts over 200 items). So after the first version
    ``size_i - size_{i-1} == bytes_added - bytes_removed`` always holds. The session's first
    prompt version is the baseline: ``0`` / ``0``. A section first seen in a later version
    compares with ``""``, so all its bytes count as added.
``similarity_prev``
    ``metric(text_{i-1}, text_i)``; ``None`` on the session's first prompt version only (no
    previous version exists).
``similarity_first``
    ``metric(first, text_i)`` where ``first`` is the section's text in the version where it
    first appeared (``1.0`` at that version).
``cumulative``
    The running sum, over the section's points so far, of ``1 - similarity_prev`` (a ``None``
    counts as ``0``). It grows by one for a section added or removed after the baseline, by
    nothing while the section stays unchanged or absent.
``cache_bust``
    True on the section whose change broke a cached prompt prefix when this version was first
    sent: the first changed section, in prompt order, after a call that had something cached
    (:mod:`sessions.cache_bust`; "cache-busting change in section X").

A metric is any ``(old: str, new: str) -> float`` returning a similarity in ``[0, 1]``, ``1``
for identical texts. Built in, selectable by name (:data:`METRICS`):

``ratio`` (default)
    ``SequenceMatcher(None, old.split(), new.split(), autojunk=False).ratio()``: ``2*M/T`` over
    whitespace-separated words, ``M`` matched words in order, ``T`` words in both texts.
``jaccard``
    ``|A & B| / |A | B|`` over the sets of whitespace-separated words (case-sensitive).
``chars``
    ``SequenceMatcher(None, old, new, autojunk=False).ratio()`` over characters.

Every built-in gives ``1.0`` for two empty texts and ``0.0`` for an empty and a non-empty one.
:func:`resolve_metric` also accepts ``"module:function"`` (``"pkg.mod:obj.attr"``) for a
researcher's own metric; importing that module is the one side effect this module can have.
"""

from __future__ import annotations

import csv
import difflib
import importlib
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from sessions.cache_bust import cache_busts
from sessions.records import PROMPT_JOINER
from sessions.replay import PromptVersion, Replay

Metric: TypeAlias = Callable[[str, str], float]
"""A similarity of two texts in ``[0, 1]``; ``1`` means identical."""


class MetricError(ValueError):
    """A metric name that resolves to nothing usable, or a metric that returned a non-number."""


@dataclass(frozen=True, slots=True)
class DriftPoint:
    """One section in one prompt version. See the module docstring for every definition."""

    version: int
    ts: str | None
    fingerprint: str
    reason: str | None
    section: str
    bytes_added: int
    bytes_removed: int
    similarity_prev: float | None
    similarity_first: float
    cumulative: float
    present: bool
    size: int
    cache_bust: bool = False


# -- metrics -----------------------------------------------------------------------------------


def ratio(old: str, new: str) -> float:
    """difflib ratio over whitespace-separated words (``2*M/T``)."""
    return difflib.SequenceMatcher(None, old.split(), new.split(), autojunk=False).ratio()


def jaccard(old: str, new: str) -> float:
    """Jaccard index of the two texts' word sets; ``1.0`` when both are empty."""
    a, b = set(old.split()), set(new.split())
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def chars(old: str, new: str) -> float:
    """difflib ratio over characters (slower than ``ratio`` on long texts)."""
    return difflib.SequenceMatcher(None, old, new, autojunk=False).ratio()


METRICS: Mapping[str, Metric] = {"ratio": ratio, "jaccard": jaccard, "chars": chars}
DEFAULT_METRIC = "ratio"


def resolve_metric(spec: str | Metric) -> Metric:
    """A metric by built-in name, by ``"module:function"`` path, or the callable itself."""
    if callable(spec):
        return spec
    if spec in METRICS:
        return METRICS[spec]
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise MetricError(
            f"unknown metric {spec!r} (built in: {', '.join(METRICS)}; or module:function)"
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise MetricError(f"metric {spec!r}: cannot import {module_name!r} ({exc})") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise MetricError(f"metric {spec!r}: {module_name} has no {attr_path!r}") from exc
    if not callable(target):
        raise MetricError(f"metric {spec!r} is not callable")
    function: Metric = target
    return function


def _score(metric: Metric, old: str, new: str) -> float:
    try:
        value = metric(old, new)
    except Exception as exc:
        # A researcher's metric is foreign code: its failure is a metric error, not ours.
        name = getattr(metric, "__name__", repr(metric))
        raise MetricError(f"metric {name} failed: {type(exc).__name__}: {exc}") from exc
    # A researcher's metric may return anything; a NaN or a string would poison every sum.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MetricError(f"metric returned {repr(value)[:60]}; expected a finite number")
    return float(value)


# -- byte diff ---------------------------------------------------------------------------------


def _utf8_len(parts: Iterable[str]) -> int:
    return sum(len(p.encode("utf-8")) for p in parts)


def byte_changes(old: str, new: str) -> tuple[int, int]:
    """``(bytes_added, bytes_removed)`` from ``old`` to ``new`` by the two-level diff."""
    if old == new:
        return 0, 0
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    added = removed = 0
    lines = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in lines.get_opcodes():
        if tag == "delete":
            removed += _utf8_len(a[i1:i2])
        elif tag == "insert":
            added += _utf8_len(b[j1:j2])
        elif tag == "replace":
            x, y = "".join(a[i1:i2]), "".join(b[j1:j2])
            inner = difflib.SequenceMatcher(None, x, y, autojunk=False)
            for op, k1, k2, m1, m2 in inner.get_opcodes():
                if op in ("delete", "replace"):
                    removed += len(x[k1:k2].encode("utf-8"))
                if op in ("insert", "replace"):
                    added += len(y[m1:m2].encode("utf-8"))
    return added, removed


# -- drift -------------------------------------------------------------------------------------


def section_texts(version: PromptVersion) -> dict[str, str]:
    """Section name -> text in one version (unresolvable sections left out; duplicates joined)."""
    found: dict[str, list[str]] = {}
    for ref in version.sections:
        if ref.text is not None:
            found.setdefault(ref.name, []).append(ref.text)
    return {name: PROMPT_JOINER.join(parts) for name, parts in found.items()}


def drift(
    replay: Replay,
    *,
    metric: str | Metric = DEFAULT_METRIC,
    sections: Sequence[str] | None = None,
) -> list[DriftPoint]:
    """Drift points ordered by version, then by the section's first appearance in the session.

    ``sections`` keeps only those names (``None``: all). A session without prompt versions
    (v1, or persistence failed) has no points.
    """
    measure = resolve_metric(metric)
    # A built-in gives exactly 1.0 for equal texts, and is a pure function of its two texts:
    # most sections are unchanged between versions, so most scores need no diff at all.
    builtin = any(measure is m for m in METRICS.values())

    def score(old: str, new: str) -> float:
        return 1.0 if builtin and old == new else _score(measure, old, new)

    wanted = set(sections) if sections is not None else None
    busts = {(b.version, b.section) for b in cache_busts(replay)}
    first: dict[str, str] = {}  # section -> text at first appearance; insertion order = output
    previous: dict[str, str] = {}
    from_first: dict[str, float] = {}  # section -> similarity_first at its previous version
    total: dict[str, float] = {}
    points: list[DriftPoint] = []
    for position, version in enumerate(replay.prompts):
        texts = section_texts(version)
        for name, text in texts.items():
            if (wanted is None or name in wanted) and name not in first:
                first[name] = text
        for name, origin in first.items():
            text = texts.get(name, "")
            unchanged = name in previous and previous[name] == text
            if position == 0:
                added = removed = 0
                similar: float | None = None
            else:
                old = previous.get(name, "")
                added, removed = byte_changes(old, text)
                similar = score(old, text)
            if not (builtin and unchanged):
                from_first[name] = score(origin, text)
            total[name] = total.get(name, 0.0) + (0.0 if similar is None else 1.0 - similar)
            points.append(DriftPoint(
                version=version.number,
                ts=version.ts,
                fingerprint=version.fingerprint,
                reason=version.reason,
                section=name,
                bytes_added=added,
                bytes_removed=removed,
                similarity_prev=similar,
                similarity_first=from_first[name],
                cumulative=total[name],
                present=name in texts,
                size=len(text.encode("utf-8")),
                cache_bust=(version.number, name) in busts,
            ))
            previous[name] = text
    return points


# -- output helpers ----------------------------------------------------------------------------

COLUMNS: tuple[str, ...] = (
    "version", "ts", "fingerprint", "reason", "section", "present", "size", "bytes_added",
    "bytes_removed", "similarity_prev", "similarity_first", "cumulative", "cache_bust",
)
"""Field order of every row form (JSON keys, CSV header, table columns)."""


def as_dict(point: DriftPoint, prefix: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-ready dict in :data:`COLUMNS` order, after ``prefix`` (e.g. session, tenant)."""
    row: dict[str, Any] = dict(prefix) if prefix else {}
    for column in COLUMNS:
        row[column] = getattr(point, column)
    return row


def as_dicts(
    points: Iterable[DriftPoint], prefix: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """:func:`as_dict` of every point (the ``--format json`` rows)."""
    return [as_dict(p, prefix) for p in points]


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def to_csv(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """CSV text (header first, ``\\r\\n`` lines per RFC 4180); ``None`` is an empty cell."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_cell(row.get(c)) for c in columns])
    return buffer.getvalue()


def _table_cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if column == "bytes_added" and value:
        return f"+{value}"
    if column == "bytes_removed" and value:
        return f"-{value}"  # never "-0": nothing removed reads as 0
    return str(value)


def table_cells(row: Mapping[str, Any]) -> list[str]:
    """Display strings of one row, in its key order (floats to 3 places, ``None`` as ``-``)."""
    return [_table_cell(column, value) for column, value in row.items()]


_NUMERIC = frozenset({"version", "size", "bytes_added", "bytes_removed", "similarity_prev",
                      "similarity_first", "cumulative"})


def table_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as a left-aligned text table with a header (numbers right-aligned)."""
    if not rows:
        return ""
    header = list(rows[0].keys())
    cells = [header, *(table_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    numeric = [c in _NUMERIC for c in header]
    out = []
    for line in cells:
        padded = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(line, widths, numeric, strict=True)
        ]
        out.append("  ".join(padded).rstrip())
    return "\n".join(out) + "\n"
