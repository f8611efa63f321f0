"""The viewer's costs: per call and per session on the session page, cache-busting changes
named on their call, and the usage page (daily chart, costliest sessions) within a tenant."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from sessions.jsonl import JsonlSessionStore
from sessions.persist import persist_call, record_outcome
from sessions.records import CachePlan, CallRequest, Outcome
from tests.app.admin.helpers import serve, site_for
from tests.sessions.helpers import PROMPT_A, PROMPT_B, add, assistant, call_request, user

PLAN = CachePlan(system=1)
NOON = datetime(2026, 6, 15, 12, 0, tzinfo=UTC).timestamp()
"""When the usage page's sessions are written and read: on the wall clock, calls recorded
before a UTC midnight and a page asked for after it put them on yesterday's bar."""


def clock() -> float:
    return NOON


def planned(request: CallRequest) -> CallRequest:
    return CallRequest(request.prompt, request.reason, request.tools, request.provider,
                       request.model, request.params, request.window, cache=PLAN)


async def costly_session(data_dir: Path, session_id: str, costs: list[float], *,
                         tenant: str = "default") -> None:
    """One call per cost; the prompt changes (memory) at the second call."""
    store = JsonlSessionStore(data_dir, clock=clock)
    writer = await store.create(tenant=tenant, channel="web", conversation=f"web:{session_id}",
                                session_id=session_id)
    try:
        for n, cost in enumerate(costs):
            await add(writer, user(f"question {n}"))
            prompt = PROMPT_A if n == 0 else PROMPT_B
            report = await persist_call(writer, planned(call_request(prompt, ((0, 2 * n + 1),))))
            await add(writer, assistant(f"answer {n}"))
            await record_outcome(writer, Outcome(
                report.call, "end_turn", {"input_tokens": 100, "cache_read_input_tokens": 900,
                                          "output_tokens": 10}, 5.0, cost_usd=cost))
    finally:
        await writer.aclose()
        await store.aclose()


async def test_session_page_shows_costs_and_the_cache_busting_call(tmp_path: Path) -> None:
    """The header sums the costs and cache reads; each call shows its cost; call 2 (the
    first with the changed memory section) is flagged."""
    await costly_session(tmp_path, "s1", [0.25, 0.125])
    async with serve(site_for(tmp_path)) as viewer:
        status, page = await viewer.get("/admin/session/s1")
    assert status == 200
    assert re.search(r"<dt>cost</dt><dd>\$0\.3750</dd>", page)
    assert "1,800 input tokens read from the cache (90% of input), 0 written" in page
    assert page.count('class="cost"') == 2
    calls = page.split('id="call-')[1:]  # each call's block, in order
    badges = [re.findall(r'class="badge warn cache-bust"[^>]*>([^<]+)<', c) for c in calls]
    assert badges == [[], ["cache-busting change in section memory"]]


async def test_usage_page_charts_days_and_lists_sessions_by_cost(tmp_path: Path) -> None:
    """Today's bar carries the day's cost; sessions come costliest first, linked; a pinned
    viewer sees its tenant only."""
    await costly_session(tmp_path, "cheap", [0.5])
    await costly_session(tmp_path, "dear", [1.0, 2.0])
    await costly_session(tmp_path, "theirs", [9.0], tenant="other")
    async with serve(site_for(tmp_path, clock=clock)) as viewer:
        status, page = await viewer.get("/admin/usage?days=7")
        _, everyone = await viewer.get("/admin/usage?tenant=*")
    assert status == 200
    assert "Last 7 days: $3.5000 for 3 calls" in page
    assert len(re.findall(r'<rect[^>]*class="bar"', page)) == 7
    bar = re.search(r'<title>2026-06-15: \$3\.5000, 3 calls[^<]*</title>', page)
    assert bar is not None
    listed = re.findall(r'href="/admin/session/([^"?]+)[^"]*"', page.split('id="sessions-cost"')[1])
    assert listed == ["dear", "cheap"]
    assert "Last 30 days: $12.5000 for 4 calls" in everyone
    async with serve(site_for(tmp_path, pinned="other", clock=clock)) as viewer:
        _, pinned = await viewer.get("/admin/usage")
    assert "$9.0000 for 1 calls" in pinned
    assert "dear" not in pinned


async def test_usage_page_bad_days_is_400(tmp_path: Path) -> None:
    """days must be a whole number from 1 to 366."""
    async with serve(site_for(tmp_path)) as viewer:
        statuses = [(await viewer.get(f"/admin/usage?days={d}"))[0] for d in ("0", "x", "367")]
        ok, empty = await viewer.get("/admin/usage")
    assert statuses == [400, 400, 400]
    assert ok == 200
    assert "No calls in these days." in empty
