"""The viewer's pure parts: escaping builder, section diff, drift chart, access rule, list
order."""

from __future__ import annotations

import re

import pytest

from app.admin.auth import ALL_TENANTS, COOKIE_TTL, Access, Refused
from app.admin.chart import drift_chart, nice_ceiling
from app.admin.diff import DiffLine, diff_versions, line_diff
from app.admin.listing import ListQuery, select
from app.admin.markup import Markup, esc, join, tag
from gateway.edge.hosts import host_of
from sessions.drift import DriftPoint
from sessions.replay import PromptVersion, SectionRef
from sessions.store import SessionInfo


def version(number: int, *sections: tuple[str, str | None]) -> PromptVersion:
    refs = tuple(SectionRef(name, f"h-{name}-{text}", text) for name, text in sections)
    return PromptVersion(number, number, None, f"fp{number}", "initial", refs, None, True, None)


def point(version: int, section: str, cumulative: float, present: bool = True) -> DriftPoint:
    return DriftPoint(version, None, f"fp{version}", "r", section, 0, 0, None, 1.0, cumulative,
                      present, 1)


# -- markup ------------------------------------------------------------------------------------


def test_tag_escapes_children_and_attribute_values() -> None:
    """Text and attribute values are escaped, quotes included; Markup children are kept."""
    out = tag("a", "<b>&", tag("i", "x"), href='"><script>', class_="c")
    assert out == ('<a href="&quot;&gt;&lt;script&gt;" class="c">&lt;b&gt;&amp;'
                   "<i>x</i></a>")


def test_tag_attribute_rules() -> None:
    """None/False attributes vanish, True is bare, underscores become dashes, void has no end."""
    assert tag("input", name="q", value=None, disabled=False, required=True,
               data_src="/x") == '<input name="q" required data-src="/x">'


def test_join_flattens_and_escapes_plain_strings() -> None:
    """Nested lists flatten; plain strings and the separator are escaped, None is skipped."""
    assert join(["<", [Markup("<br>"), None, 3]], sep="&") == "&lt;&amp;<br>&amp;3"
    assert esc(Markup("<b>")) == "<b>"


# -- section diff ------------------------------------------------------------------------------


def test_diff_statuses_follow_new_order_with_removed_after_predecessor() -> None:
    """Sections pair by name; a removed one sits after the section that preceded it."""
    old = version(1, ("soul", "s"), ("gone", "g"), ("memory", "m1"), ("mood", "calm"))
    new = version(2, ("soul", "s"), ("memory", "m1\nm2"), ("kb", "k"), ("mood", "calm"))
    result = [(d.name, d.status) for d in diff_versions(old, new)]
    assert result == [("soul", "unchanged"), ("gone", "removed"), ("memory", "changed"),
                      ("kb", "added"), ("mood", "unchanged")]


def test_changed_section_carries_a_line_diff() -> None:
    """A changed section lists deleted then added lines, with counts."""
    old = version(1, ("memory", "- a\n- b"))
    new = version(2, ("memory", "- a\n- c\n- d"))
    (item,) = diff_versions(old, new)
    assert list(item.lines) == [DiffLine("same", "- a"), DiffLine("del", "- b"),
                                DiffLine("add", "- c"), DiffLine("add", "- d")]
    assert (item.added, item.removed) == (2, 1)


def test_section_without_text_is_changed_but_unavailable() -> None:
    """When a section text is missing from the log only the hash decides, with no lines."""
    (item,) = diff_versions(version(1, ("memory", None)), version(2, ("memory", "x")))
    assert (item.status, item.available, item.lines) == ("changed", False, ())


def test_long_unchanged_runs_are_cut_to_context() -> None:
    """Unchanged lines far from a change become one skip line counting them."""
    old = "\n".join(f"line {i}" for i in range(20))
    new = old.replace("line 10", "line ten")
    kinds = [(line.kind, line.count) for line in line_diff(old, new, context=2)]
    assert kinds == [("skip", 8), ("same", 1), ("same", 1), ("del", 1), ("add", 1),
                     ("same", 1), ("same", 1), ("skip", 7)]


def test_lines_appended_at_the_end_keep_their_context() -> None:
    """An append after the last line shows the lines before it, not a skip."""
    lines = line_diff("## Memory\n- a", "## Memory\n- a\n\n- b")
    assert [(line.kind, line.text) for line in lines] == [
        ("same", "## Memory"), ("same", "- a"), ("add", ""), ("add", "- b")]


# -- chart -------------------------------------------------------------------------------------


def test_chart_has_a_line_per_section_axes_and_legend() -> None:
    """One polyline per section, both axis labels, a legend entry per section."""
    svg = drift_chart([point(1, "soul", 0), point(1, "memory", 0), point(2, "soul", 0),
                       point(2, "memory", 0.5)], "ratio")
    assert svg.startswith("<svg")
    assert len(re.findall(r"<polyline ", svg)) == 2
    assert "prompt version" in svg
    assert "cumulative drift" in svg
    assert svg.count('class="legend-item"') == 2
    assert 'data-section="memory"' in svg


def test_chart_escapes_section_names_and_handles_no_points() -> None:
    """A hostile section name is escaped; no points gives a sentence, not an empty chart."""
    svg = drift_chart([point(1, "<script>", 0)], "ratio")
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg
    assert "<svg" not in drift_chart([], "ratio")


def test_nice_ceiling() -> None:
    """The y axis tops out at a round number at least 1."""
    assert [nice_ceiling(v) for v in (0, 0.3, 1.2, 2.1, 3, 7, 12)] == [1, 1, 2, 2.5, 5, 10, 20]


# -- access ------------------------------------------------------------------------------------


def test_cookie_round_trip_expiry_and_tamper() -> None:
    """A cookie is valid until its TTL, only for the token that issued it, and not editable."""
    access = Access("secret")
    cookie = access.issue_cookie(now=1_000_000)
    assert access.cookie_valid(cookie, now=1_000_000 + COOKIE_TTL)
    assert not access.cookie_valid(cookie, now=1_000_001 + COOKIE_TTL)
    assert not Access("other").cookie_valid(cookie, now=1_000_000)
    assert not access.cookie_valid("1000001" + cookie[7:], now=1_000_000)
    assert "secret" not in cookie


def test_authenticate_bearer_cookie_and_loopback_rules() -> None:
    """Token: Bearer or cookie, else 401. No token: loopback Host only, else 403."""
    access = Access("secret")
    access.authenticate("example.org", "Bearer secret", None)
    access.authenticate("example.org", "", access.issue_cookie())
    with pytest.raises(Refused) as info:
        access.authenticate("127.0.0.1", "Bearer wrong", "1.abc")
    assert info.value.status == 401
    open_viewer = Access(None)
    open_viewer.authenticate("localhost:8788", "", None)
    open_viewer.authenticate("[::1]:8788", "", None)
    with pytest.raises(Refused) as info:
        open_viewer.authenticate("evil.example:8788", "", None)
    assert info.value.status == 403
    assert host_of("[::1]:80") == "::1"


@pytest.mark.parametrize(
    ("pinned", "requested", "expected"),
    [
        (None, None, "default"), (None, "acme", "acme"), (None, "*", ALL_TENANTS),
        (None, "../x", 400), ("acme", None, "acme"), ("acme", "acme", "acme"),
        ("acme", "default", 403), ("acme", "*", 403),
    ],
)
def test_tenancy_rule(pinned: str | None, requested: str | None, expected: str | int) -> None:
    """Home tenant by default; others and * only on an unpinned (admin-scoped) viewer."""
    access = Access("t", pinned=pinned)
    if isinstance(expected, int):
        with pytest.raises(Refused) as info:
            access.tenant_for(requested)
        assert info.value.status == expected
    else:
        assert access.tenant_for(requested) == expected


# -- tool calls --------------------------------------------------------------------------------


def test_tool_results_show_server_duration_and_outcome() -> None:
    """A tool-results message with meta.toolCalls shows, on each result, the server and tool
    that answered, how long it took and how it ended (escaped like everything else)."""
    from app.admin.render import message_view

    message = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "shelf 0"},
        {"type": "tool_result", "tool_use_id": "t2", "content": "too slow", "is_error": True},
    ]}
    meta = {"toolCalls": [
        {"id": "t1", "tool": "desk__lookup", "server": "desk", "name": "lookup", "ms": 12.4,
         "outcome": "ok"},
        {"id": "t2", "tool": "desk__slow", "server": "<desk>", "name": "slow", "ms": 1500.2,
         "outcome": "timeout"},
    ]}
    html = str(message_view(message, index=3, meta=meta))
    assert '<code>desk: lookup</code> <span class="muted">12 ms</span> ' \
           '<span class="badge">ok</span>' in html
    assert '<code>&lt;desk&gt;: slow</code> <span class="muted">1500 ms</span> ' \
           '<span class="badge warn">timeout</span>' in html
    assert "desk: lookup" not in str(message_view(message, index=3))


# -- session list ------------------------------------------------------------------------------


def test_session_list_keeps_a_conversations_sessions_in_creation_order() -> None:
    """Newest first, but the sessions of one conversation in the order they were created (the
    header's generation), though a worker's clock put the later one's start earlier; another
    conversation's row stays where its start time puts it."""
    def row(sid: str, conversation: str, second: int, generation: int) -> SessionInfo:
        return SessionInfo(sid, "default", f"2026-09-01T09:00:0{second}.000Z", "web",
                           conversation, 3, 1, "hi", 10, float(second), generation=generation)

    rows = [row("s1", "c", 2, 1), row("x", "d", 1, 1), row("s2", "c", 0, 2)]
    page, total, pages = select(rows, ListQuery(tenant="default", home="default"))
    assert ([i.session_id for i in page], total, pages) == (["s2", "x", "s1"], 3, 1)
