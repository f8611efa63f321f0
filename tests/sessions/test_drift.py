"""Prompt drift: exact byte counts and similarities on a session with known section edits."""

from __future__ import annotations

import csv
import io
import math
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessions.drift import (
    COLUMNS,
    METRICS,
    DriftPoint,
    MetricError,
    as_dicts,
    byte_changes,
    drift,
    jaccard,
    ratio,
    resolve_metric,
    table_text,
    to_csv,
)
from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call, record_outcome
from sessions.records import Outcome, Prompt
from sessions.replay import Replay, replay_bytes
from tests.sessions.helpers import (
    MEMORY_1,
    MEMORY_2,
    SEED_DIR,
    SOUL,
    add,
    assistant,
    call_request,
    make_prompt,
    user,
)

MOOD_CALM = "## Mood\ncalm"
MOOD_TIRED = "## Mood\ntired"  # no character in common with "calm": 4 bytes out, 5 in
KB = "## KB\nCafé ☕ opens at 9."  # é is 2 bytes, ☕ 3 in UTF-8
SOUL_BRIEF = SOUL + "\nBe brief."

VERSIONS: tuple[Prompt, ...] = (
    make_prompt(("soul", SOUL), ("memory", MEMORY_1), ("mood", MOOD_CALM)),
    make_prompt(("soul", SOUL), ("memory", MEMORY_2), ("mood", MOOD_TIRED)),
    make_prompt(("soul", SOUL), ("memory", MEMORY_2), ("kb", KB)),  # mood removed, kb added
    make_prompt(("soul", SOUL_BRIEF), ("memory", MEMORY_2), ("mood", MOOD_CALM), ("kb", KB)),
)


async def build_drift_session(data_dir: Path, session_id: str = "drift", tenant: str = "default",
                              ) -> Path:
    """A v3 session, one call per version of :data:`VERSIONS`, written by the real store."""
    store = JsonlSessionStore(data_dir, durability="none")
    writer = await store.create(tenant=tenant, channel="console", conversation=session_id,
                                session_id=session_id)
    for call, prompt in enumerate(VERSIONS):
        await add(writer, user(f"question {call}"))
        reason = "initial" if call == 0 else "rebuilt"
        await persist_call(writer, call_request(prompt, ((0, 2 * call + 1),), reason=reason))
        await add(writer, assistant(f"answer {call}"))
        await record_outcome(writer, Outcome(call=call, stop_reason="end_turn"))
    await writer.aclose()
    return writer.path


def b(text: str) -> int:
    return len(text.encode("utf-8"))


def length_metric(old: str, new: str) -> float:
    """A researcher's metric: ratio of the shorter to the longer length (for module:function)."""
    longest = max(len(old), len(new))
    return min(len(old), len(new)) / longest if longest else 1.0


@pytest.fixture
async def replay(tmp_path: Path) -> Replay:
    return replay_bytes((await build_drift_session(tmp_path / "data")).read_bytes())


def by_key(points: list[DriftPoint]) -> dict[tuple[int, str], DriftPoint]:
    return {(p.version, p.section): p for p in points}


def test_word_counts_used_below() -> None:
    """The hand-computed word lists behind the expected similarities."""
    assert MEMORY_1.split() == ["##", "Memory", "-", "Ada", "likes", "tea."]
    assert MEMORY_2.split() == [*MEMORY_1.split(), "-", "Ada", "prefers", "short", "answers."]
    assert len(SOUL.split()) == 6
    assert SOUL_BRIEF.split() == [*SOUL.split(), "Be", "brief."]


async def test_points_in_version_then_first_appearance_order(replay: Replay) -> None:
    """One point per version and section seen so far; sections ordered by first appearance."""
    points = drift(replay)
    assert [(p.version, p.section, p.present) for p in points] == [
        (1, "soul", True), (1, "memory", True), (1, "mood", True),
        (2, "soul", True), (2, "memory", True), (2, "mood", True),
        (3, "soul", True), (3, "memory", True), (3, "mood", False), (3, "kb", True),
        (4, "soul", True), (4, "memory", True), (4, "mood", True), (4, "kb", True),
    ]
    assert [(p.fingerprint, p.reason) for p in points if p.section == "soul"] == [
        (VERSIONS[0].fingerprint, "initial"), (VERSIONS[1].fingerprint, "rebuilt"),
        (VERSIONS[2].fingerprint, "rebuilt"), (VERSIONS[3].fingerprint, "rebuilt"),
    ]
    assert all(p.ts for p in points)


async def test_exact_bytes_and_sizes(replay: Replay) -> None:
    """Added/removed bytes per known edit: appends, a full line swap, removal, UTF-8 re-add."""
    got = {k: (p.bytes_added, p.bytes_removed, p.size) for k, p in by_key(drift(replay)).items()}
    assert got == {
        (1, "soul"): (0, 0, b(SOUL)),
        (1, "memory"): (0, 0, b(MEMORY_1)),
        (1, "mood"): (0, 0, b(MOOD_CALM)),
        (2, "soul"): (0, 0, b(SOUL)),
        (2, "memory"): (b(MEMORY_2) - b(MEMORY_1), 0, b(MEMORY_2)),  # a pure append
        (2, "mood"): (5, 4, b(MOOD_TIRED)),  # "calm" -> "tired"
        (3, "soul"): (0, 0, b(SOUL)),
        (3, "memory"): (0, 0, b(MEMORY_2)),
        (3, "mood"): (0, b(MOOD_TIRED), 0),  # removed
        (3, "kb"): (b(KB), 0, b(KB)),  # added after the baseline: all of it counts
        (4, "soul"): (b("\nBe brief."), 0, b(SOUL_BRIEF)),
        (4, "memory"): (0, 0, b(MEMORY_2)),
        (4, "mood"): (b(MOOD_CALM), 0, b(MOOD_CALM)),  # back again
        (4, "kb"): (0, 0, b(KB)),
    }
    assert b(KB) == len(KB) + 1 + 2  # the UTF-8 bytes really differ from the characters


async def test_ratio_similarities_and_cumulative(replay: Replay) -> None:
    """Word-ratio 2M/T to the previous and the first version, and the running sum of 1 - prev."""
    memory = Fraction(2 * 6, 6 + 11)
    mood = Fraction(2 * 2, 3 + 3)  # "##", "Mood" kept; "calm" -> "tired"
    soul = Fraction(2 * 6, 6 + 8)
    expected: dict[tuple[int, str], tuple[float | None, float, Fraction]] = {
        (1, "soul"): (None, 1.0, Fraction(0)),
        (1, "memory"): (None, 1.0, Fraction(0)),
        (1, "mood"): (None, 1.0, Fraction(0)),
        (2, "soul"): (1.0, 1.0, Fraction(0)),
        (2, "memory"): (float(memory), float(memory), 1 - memory),
        (2, "mood"): (float(mood), float(mood), 1 - mood),
        (3, "soul"): (1.0, 1.0, Fraction(0)),
        (3, "memory"): (1.0, float(memory), 1 - memory),
        (3, "mood"): (0.0, 0.0, 1 - mood + 1),
        (3, "kb"): (0.0, 1.0, Fraction(1)),
        (4, "soul"): (float(soul), float(soul), 1 - soul),
        (4, "memory"): (1.0, float(memory), 1 - memory),
        (4, "mood"): (0.0, 1.0, 1 - mood + 2),  # first appearance was "calm": identical again
        (4, "kb"): (1.0, 1.0, Fraction(1)),
    }
    points = by_key(drift(replay))
    assert set(points) == set(expected)
    for key, (prev, first, cumulative) in expected.items():
        point = points[key]
        assert (point.similarity_prev, point.similarity_first) == (prev, first), key
        assert point.cumulative == pytest.approx(float(cumulative), abs=1e-12), key


async def test_jaccard_metric_by_name(replay: Replay) -> None:
    """--metric jaccard: |A&B|/|A|B| over word sets (memory 6/9, mood 2/4, soul 6/8)."""
    points = by_key(drift(replay, metric="jaccard"))
    assert points[2, "memory"].similarity_prev == 6 / 9
    assert points[2, "mood"].similarity_prev == 2 / 4
    assert points[4, "soul"].similarity_prev == 6 / 8
    assert points[3, "mood"].similarity_prev == 0.0
    assert points[4, "mood"].similarity_first == 1.0


async def test_sections_filter(replay: Replay) -> None:
    """sections= keeps only the named sections; an unknown name gives no points."""
    points = drift(replay, sections=["kb", "mood"])
    assert [(p.version, p.section) for p in points] == [
        (1, "mood"), (2, "mood"), (3, "mood"), (3, "kb"), (4, "mood"), (4, "kb"),
    ]
    assert drift(replay, sections=["nope"]) == []


async def test_pluggable_metric_by_dotted_path(replay: Replay) -> None:
    """A "module:function" metric is imported and used for both similarities."""
    spec = f"{__name__}:length_metric"
    assert resolve_metric(spec) is length_metric
    points = by_key(drift(replay, metric=spec))
    assert points[2, "mood"].similarity_prev == len(MOOD_CALM) / len(MOOD_TIRED)
    assert points[4, "soul"].similarity_first == len(SOUL) / len(SOUL_BRIEF)
    assert by_key(drift(replay, metric=length_metric)) == points


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "unknown metric 'nope'"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("math:no_such_function", "math has no 'no_such_function'"),
        ("math:pi", "is not callable"),
        (":f", "unknown metric"),
    ],
)
def test_bad_metric_names_are_refused(spec: str, message: str) -> None:
    """A name that resolves to no callable is a MetricError saying why."""
    with pytest.raises(MetricError, match=message):
        resolve_metric(spec)


@pytest.mark.parametrize("value", [math.nan, math.inf, "0.5", True])
async def test_metric_returning_a_non_number_is_refused(replay: Replay, value: object) -> None:
    """A metric result that is not a finite number stops drift with a MetricError."""
    with pytest.raises(MetricError, match="expected a finite number"):
        drift(replay, metric=lambda old, new: value)  # type: ignore[arg-type,return-value]


async def test_metric_that_raises_becomes_a_metric_error(replay: Replay) -> None:
    """A researcher's metric that crashes surfaces as a MetricError naming it."""
    def broken(old: str, new: str) -> float:
        raise ZeroDivisionError("oops")

    with pytest.raises(MetricError, match="metric broken failed: ZeroDivisionError: oops"):
        drift(replay, metric=broken)


def test_seed_v2_has_one_prompt_section() -> None:
    """A v2 log's inline prompt is the one section "prompt"; both edits were pure appends."""
    seed = replay_bytes((SEED_DIR / "v2-prompt-timeline.jsonl").read_bytes())
    texts = [v.text for v in seed.prompts]
    assert all(t is not None for t in texts)
    t1, t2, t3 = (t or "" for t in texts)
    assert t2.startswith(t1)
    assert t3.startswith(t2)
    points = drift(seed)
    assert [(p.version, p.section, p.present) for p in points] == [
        (1, "prompt", True), (2, "prompt", True), (3, "prompt", True),
    ]
    assert [(p.bytes_added, p.bytes_removed, p.size) for p in points] == [
        (0, 0, b(t1)), (b(t2) - b(t1), 0, b(t2)), (b(t3) - b(t2), 0, b(t3)),
    ]
    assert [p.similarity_prev for p in points] == [None, ratio(t1, t2), ratio(t2, t3)]
    assert [p.similarity_first for p in points] == [1.0, ratio(t1, t2), ratio(t1, t3)]


def test_v1_log_has_no_points() -> None:
    """A log without prompt versions has nothing to compare."""
    assert drift(replay_bytes((SEED_DIR / "v1-messages-only.jsonl").read_bytes())) == []


def test_builtin_metrics_edge_cases() -> None:
    """Two empty texts are identical (1.0); empty against non-empty shares nothing (0.0)."""
    assert (ratio("", ""), jaccard("", ""), ratio("", "a b"), jaccard("a", "")) == (
        1.0, 1.0, 0.0, 0.0)
    assert jaccard("a a b", "b c") == 1 / 3


@given(st.text(max_size=60), st.text(max_size=60))
def test_byte_changes_account_for_the_size_difference(old: str, new: str) -> None:
    """added - removed is always the UTF-8 size difference, each bounded by its side's size."""
    added, removed = byte_changes(old, new)
    assert added - removed == b(new) - b(old)
    assert 0 <= added <= b(new)
    assert 0 <= removed <= b(old)


async def test_json_rows_follow_columns(replay: Replay) -> None:
    """as_dicts gives COLUMNS in order, after an optional prefix, with raw values."""
    points = drift(replay, sections=["mood"])
    rows = as_dicts(points, {"tenant": "default", "session": "drift"})
    assert [list(r) for r in rows] == [["tenant", "session", *COLUMNS]] * 4
    assert rows[0]["similarity_prev"] is None
    assert rows[2]["present"] is False
    assert list(as_dicts(points)[0]) == list(COLUMNS)


async def test_csv_shape(replay: Replay) -> None:
    """CSV: the header is COLUMNS, one line per point, None empty, booleans lower-case."""
    points = drift(replay, sections=["mood"])
    text = to_csv(as_dicts(points))
    parsed = list(csv.reader(io.StringIO(text)))
    assert parsed[0] == list(COLUMNS)
    assert len(parsed) == 1 + len(points)
    row = dict(zip(COLUMNS, parsed[3], strict=True))
    assert (row["version"], row["present"], row["size"], row["bytes_removed"]) == (
        "3", "false", "0", str(b(MOOD_TIRED)))
    assert dict(zip(COLUMNS, parsed[1], strict=True))["similarity_prev"] == ""
    assert float(row["cumulative"]) == points[2].cumulative


async def test_table_text_is_aligned(replay: Replay) -> None:
    """The text table has a header and one line per point, every column aligned; nothing
    removed reads 0, never -0."""
    points = drift(replay, sections=["soul"])
    lines = table_text(as_dicts(points)).splitlines()
    assert lines[0].split() == list(COLUMNS)
    assert len(lines) == 1 + len(points)
    # (The last column, cache_bust, is "no": these calls had nothing cached.)
    assert lines[1].split()[-4:] == ["-", "1.000", "0.000", "no"]
    assert lines[4].split()[-7:] == [str(b(SOUL_BRIEF)), "+10", "0", "0.857", "0.857", "0.143",
                                     "no"]
    starts = {line.index(p.fingerprint) for line, p in zip(lines[1:], points, strict=True)}
    assert starts == {lines[0].index("fingerprint")}
    assert table_text([]) == ""


@pytest.mark.parametrize("name", sorted(METRICS))
async def test_shortcuts_for_unchanged_sections_change_no_number(replay: Replay,
                                                                 name: str) -> None:
    """A built-in metric skips the diff of unchanged texts; every point still equals what the
    same metric gives when called for every pair (as a researcher's metric is)."""
    builtin = METRICS[name]

    def every_pair(old: str, new: str) -> float:
        return builtin(old, new)

    assert drift(replay, metric=name) == drift(replay, metric=every_pair)
