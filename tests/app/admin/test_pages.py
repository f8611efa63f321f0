"""The viewer's pages over HTTP: a real server on port 0 and real JSONL logs in tmp_path."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from app.admin.auth import COOKIE
from app.compose import build_gateway
from app.config import Settings
from providers.offline import OfflineProvider
from sessions import entries
from sessions.jsonl import JsonlSessionStore
from tests.app.admin.helpers import SCRIPT, TOKEN, raw_session, rich_session, serve, site_for
from tests.sessions.helpers import SEED_DIR, assistant

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def session_links(page: str) -> list[str]:
    return re.findall(r'href="/admin/session/([^"/?]+)[^"]*"', page)


# -- auth --------------------------------------------------------------------------------------


async def test_open_viewer_on_loopback_needs_no_token(tmp_path: Path) -> None:
    """Standalone without a token: the list is served to a loopback Host."""
    raw_session(tmp_path, "s1")
    async with serve(site_for(tmp_path)) as viewer:
        status, page = await viewer.get("/admin/")
    assert status == 200
    assert session_links(page) == ["s1"]


async def test_open_viewer_refuses_foreign_host_header(tmp_path: Path) -> None:
    """Without a token a non-loopback Host (DNS rebinding) gets 403 and no data."""
    raw_session(tmp_path, "s1")
    async with serve(site_for(tmp_path)) as viewer:
        status, page = await viewer.get("/admin/", headers={"Host": "evil.example"})
    assert status == 403
    assert "s1" not in page


async def test_token_missing_or_wrong_is_401_with_login_form(tmp_path: Path) -> None:
    """With a token, no credentials or a wrong Bearer get 401 and the sign-in form."""
    raw_session(tmp_path, "s1")
    async with serve(site_for(tmp_path, TOKEN)) as viewer:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
            status, page = await viewer.get("/admin/session/s1", headers=headers)
            assert status == 401
            assert 'name="token"' in page
            assert "s1</code>" not in page
        status, _ = await viewer.get("/admin/session/s1", headers=BEARER)
    assert status == 200


async def test_login_form_sets_strict_httponly_cookie(tmp_path: Path) -> None:
    """Signing in sets an HttpOnly SameSite=Strict cookie (not the token) that lets you in."""
    raw_session(tmp_path, "s1")
    async with serve(site_for(tmp_path, TOKEN)) as viewer:
        url = viewer.base + "/admin/login"
        async with viewer.client.post(url, data={"token": "wrong", "next": "/admin/"},
                                      allow_redirects=False) as resp:
            assert resp.status == 401
        async with viewer.client.post(url, data={"token": TOKEN, "next": "/admin/session/s1"},
                                      allow_redirects=False) as resp:
            assert resp.status == 303
            assert resp.headers["Location"] == "/admin/session/s1"
            set_cookie = resp.headers["Set-Cookie"]
        assert "HttpOnly" in set_cookie
        assert "SameSite=Strict" in set_cookie
        assert "Path=/admin" in set_cookie
        assert TOKEN not in set_cookie
        status, page = await viewer.get("/admin/")
        assert status == 200
        assert "Sign out" in page
        async with viewer.client.post(viewer.base + "/admin/logout",
                                      allow_redirects=False) as resp:
            assert resp.status == 303
        viewer.client.cookie_jar.clear()
        status, _ = await viewer.get("/admin/")
    assert status == 401


async def test_login_redirect_stays_on_the_viewer(tmp_path: Path) -> None:
    """A next= pointing off-site is replaced by the sessions list (no open redirect)."""
    async with serve(site_for(tmp_path, TOKEN)) as viewer:
        url = viewer.base + "/admin/login"
        form = {"token": TOKEN, "next": "//evil.example/admin/"}
        async with viewer.client.post(url, data=form, allow_redirects=False) as resp:
            location = resp.headers["Location"]
    assert location == "/admin/"


async def test_gateway_without_admin_token_has_no_admin_pages(tmp_path: Path) -> None:
    """No GATEWAY_ADMIN_TOKEN: /admin/ is 404 on the gateway; with one it is 401 then 200."""
    for token, statuses in ((None, (404, 404)), (TOKEN, (401, 200))):
        env: dict[str, Any] = {"GATEWAY_DATA_DIR": str(tmp_path / ("with" if token else "without")),
               "GATEWAY_PORT": 0, "GATEWAY_ADMIN_TOKEN": token}
        settings = Settings(_env_file=None, **env)  # type: ignore[call-arg]  # pydantic-settings
        gateway = build_gateway(settings, provider=OfflineProvider())
        await gateway.start()
        try:
            base = f"http://127.0.0.1:{gateway.bound_port}/admin/"
            async with aiohttp.ClientSession() as http:
                async with http.get(base) as plain:
                    got_plain = plain.status
                async with http.get(base, headers=BEARER) as authed:
                    got_authed = authed.status
        finally:
            await gateway.aclose()
        assert (got_plain, got_authed) == statuses


# -- tenancy -----------------------------------------------------------------------------------


@pytest.fixture
def two_tenants(tmp_path: Path) -> Path:
    raw_session(tmp_path, "home-1", first="default tenant's secret")
    raw_session(tmp_path, "acme-1", tenant="acme", first="acme's secret")
    return tmp_path


async def test_tenant_isolation_in_list_and_by_id(two_tenants: Path) -> None:
    """The default view lists only its tenant; another tenant's id is 404 from it."""
    async with serve(site_for(two_tenants, TOKEN)) as viewer:
        _, page = await viewer.get("/admin/", headers=BEARER)
        status, other = await viewer.get("/admin/session/acme-1", headers=BEARER)
        _, named = await viewer.get("/admin/session/acme-1?tenant=acme", headers=BEARER)
    assert session_links(page) == ["home-1"]
    assert "acme&#x27;s secret" not in page
    assert status == 404
    assert "acme&#x27;s secret" not in other
    assert "acme&#x27;s secret" in named


async def test_all_tenants_needs_admin_scope(two_tenants: Path) -> None:
    """?tenant=* lists every tenant (with a tenant column) for the admin token."""
    async with serve(site_for(two_tenants, TOKEN)) as viewer:
        status, page = await viewer.get("/admin/?tenant=*", headers=BEARER)
    assert status == 200
    assert sorted(session_links(page)) == ["acme-1", "home-1"]
    assert "<th>tenant</th>" in page
    assert 'href="/admin/session/acme-1?tenant=acme"' in page


async def test_pinned_viewer_never_shows_another_tenant(two_tenants: Path) -> None:
    """A viewer pinned with --tenant shows that tenant only; other tenants and * are 403."""
    async with serve(site_for(two_tenants, pinned="acme")) as viewer:
        _, page = await viewer.get("/admin/")
        statuses = [(await viewer.get(path))[0] for path in (
            "/admin/?tenant=default", "/admin/?tenant=*", "/admin/session/home-1?tenant=default")]
        missing, _ = await viewer.get("/admin/session/home-1")
    assert session_links(page) == ["acme-1"]
    assert statuses == [403, 403, 403]
    assert missing == 404


# -- list: filters and pagination --------------------------------------------------------------


async def test_filters_match_channel_id_conversation_and_first_message(tmp_path: Path) -> None:
    """channel= is exact; q= matches id, conversation or first user message, any case."""
    raw_session(tmp_path, "alpha", channel="web", conversation="web:blue", first="Tea please",
                started="2026-01-01T00:00:01.000Z")
    raw_session(tmp_path, "beta", channel="telegram", conversation="telegram:42",
                first="coffee", started="2026-01-01T00:00:02.000Z")
    raw_session(tmp_path, "gamma", channel="slack", conversation="slack:blue", first="hi",
                started="2026-01-01T00:00:03.000Z")
    async with serve(site_for(tmp_path)) as viewer:
        got: dict[str, list[str]] = {}
        for query in ("", "channel=telegram", "q=BLUE", "q=tea", "q=bet", "q=zzz",
                      "q=blue&channel=slack"):
            status, page = await viewer.get(f"/admin/?{query}")
            assert status == 200
            got[query] = session_links(page)
    assert got == {
        "": ["gamma", "beta", "alpha"], "channel=telegram": ["beta"], "q=BLUE": ["gamma", "alpha"],
        "q=tea": ["alpha"], "q=bet": ["beta"], "q=zzz": [], "q=blue&channel=slack": ["gamma"],
    }


async def test_pagination_newest_first_fifty_per_page(tmp_path: Path) -> None:
    """120 sessions: pages of 50, 50, 20, newest first, links keep the filters."""
    for i in range(120):
        raw_session(tmp_path, f"s{i:03d}", started=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z")
    async with serve(site_for(tmp_path)) as viewer:
        pages = [session_links((await viewer.get(f"/admin/?q=s&page={n}"))[1])
                 for n in (1, 2, 3)]
        _, first = await viewer.get("/admin/?q=s")
        bad = [(await viewer.get(f"/admin/?page={p}"))[0] for p in ("0", "x", "-1")]
    assert [len(p) for p in pages] == [50, 50, 20]
    assert pages[0][0] == "s119"
    assert pages[2][-1] == "s000"
    assert [sid for p in pages for sid in p] == [f"s{i:03d}" for i in range(119, -1, -1)]
    assert 'href="/admin/?q=s&amp;page=2"' in first
    assert bad == [400, 400, 400]


# -- session page ------------------------------------------------------------------------------


async def test_session_page_shows_markers_requests_diff_and_chart(tmp_path: Path) -> None:
    """Prompt-change marker with reason, per-call request details, diff form and SVG chart."""
    store = JsonlSessionStore(tmp_path)
    sid = await rich_session(store)
    async with serve(site_for(tmp_path)) as viewer:
        status, page = await viewer.get(f"/admin/session/{sid}")
    assert status == 200
    assert page.count('class="marker"') == 2
    assert 'data-reason="rebuilt:memory_write"' in page
    assert page.count('<details class="call"') == 2
    assert "## Memory\n- Ada likes tea.\n- Ada prefers short answers." in page
    assert "claude-test" in page
    assert "tool_use" in page
    assert "12.5 ms" in page
    assert 'action="/admin/session/rich-1/diff"' in page
    assert re.search(r"<svg[^>]*drift-chart.*<polyline", page, re.S)
    assert "memory_write" in page
    assert "get_time" in page


async def test_untrusted_text_is_escaped_everywhere(tmp_path: Path) -> None:
    """<script> in messages, tool input, results and the list is shown as text, never run."""
    store = JsonlSessionStore(tmp_path)
    sid = await rich_session(store)
    async with serve(site_for(tmp_path)) as viewer:
        pages = [(await viewer.get(path))[1] for path in (
            "/admin/", f"/admin/session/{sid}", f"/admin/session/{sid}/call/2",
            f"/admin/session/{sid}/diff?a=1&b=2", f"/admin/?q={SCRIPT}")]
    for page in pages:
        scripts = re.findall(r"<script[^>]*>", page)
        assert scripts == ['<script src="/admin/static/admin.js" defer>']
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in pages[1]


async def test_diff_page_shows_changed_memory_section(tmp_path: Path) -> None:
    """Diff v1 -> v2: memory changed with its added line; other sections unchanged."""
    store = JsonlSessionStore(tmp_path)
    sid = await rich_session(store)
    async with serve(site_for(tmp_path)) as viewer:
        status, page = await viewer.get(f"/admin/session/{sid}/diff?a=1&b=2")
    assert status == 200
    statuses = re.findall(r'data-section="([^"]+)" data-status="([^"]+)"', page)
    assert statuses == [("soul", "unchanged"), ("memory", "changed"), ("mood", "unchanged")]
    assert '<span class="add">+ - Ada prefers short answers.\n</span>' in page


async def test_turn_page_and_fragment(tmp_path: Path) -> None:
    """A call's own page has the rebuilt request body; ?fragment=1 is just the details."""
    store = JsonlSessionStore(tmp_path)
    sid = await rich_session(store)
    async with serve(site_for(tmp_path)) as viewer:
        _, page = await viewer.get(f"/admin/session/{sid}/call/1")
        _, fragment = await viewer.get(f"/admin/session/{sid}/call/1?fragment=1")
    assert "Request body as rebuilt by replay" in page
    assert "&quot;max_tokens&quot;: 256" in page
    assert fragment.startswith('<div class="request">')
    assert "<html" not in fragment


async def test_old_turn_addresses_redirect_to_the_call_page(tmp_path: Path) -> None:
    """A bookmarked .../turn/N answers a permanent redirect to .../call/N, query kept, and
    following it gives the same page the new address does."""
    store = JsonlSessionStore(tmp_path)
    sid = await rich_session(store)
    async with serve(site_for(tmp_path)) as viewer:
        old = f"{viewer.base}/admin/session/{sid}/turn/1?fragment=1&tenant=default"
        async with viewer.client.get(old, allow_redirects=False) as resp:
            status, location = resp.status, resp.headers["Location"]
        _, followed = await viewer.get(f"/admin/session/{sid}/turn/1?fragment=1")
        _, direct = await viewer.get(f"/admin/session/{sid}/call/1?fragment=1")
    assert (status, location) == (301, f"/admin/session/{sid}/call/1?fragment=1&tenant=default")
    assert followed == direct
    assert direct.startswith('<div class="request">')


async def test_calls_replay_cannot_rebuild_are_marked_and_offer_no_body(tmp_path: Path) -> None:
    """A call the log refused is marked with why (on the session and its own page), and its
    page offers no request body; a refused answer is noted on its call."""
    gap_call = {**entries.gap("EIO", "2026-01-01T00:00:01.000Z", [{"type": "call"}]),
                "seq": 2, "ts": "2026-01-01T00:00:01.000Z"}
    answer = {**entries.message(assistant("hello")), "seq": 3, "ts": "2026-01-01T00:00:01.000Z"}
    raw_session(tmp_path, "gappy", extra_lines=[orjson.dumps(gap_call) + b"\n",
                                                orjson.dumps(answer) + b"\n"])
    async with serve(site_for(tmp_path)) as viewer:
        _, page = await viewer.get("/admin/session/gappy")
        _, turn = await viewer.get("/admin/session/gappy/call/1")
    marked = ('<span class="badge bad" data-status="not_recorded">not recorded (persist failed:'
              ' EIO at 2026-01-01T00:00:01.000Z)</span>')
    assert marked in page
    assert marked in turn
    assert "Request body as rebuilt by replay" not in turn
    assert "No request body: this call was not recorded (persist failed: EIO" in turn


async def test_big_sessions_load_call_details_lazily(tmp_path: Path) -> None:
    """Over the inline budget each call holds a link and a data-src instead of its request."""
    store = JsonlSessionStore(tmp_path)
    sid = await rich_session(store)
    async with serve(site_for(tmp_path, inline_budget=10)) as viewer:
        _, page = await viewer.get(f"/admin/session/{sid}")
    assert page.count('data-src="/admin/session/rich-1/call/') == 2
    assert '<pre class="prompt">' not in page


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/admin/session/no-such", 404),
        ("/admin/session/..%2F..%2Fetc", 400),
        ("/admin/session/a%20b", 400),
        ("/admin/session/rich-1?tenant=..", 400),
        ("/admin/session/rich-1?tenant=*", 400),
        ("/admin/session/rich-1?metric=os:system", 400),
        ("/admin/session/rich-1/call/0", 400),
        ("/admin/session/rich-1/call/x", 400),
        ("/admin/session/rich-1/call/3", 404),
        ("/admin/session/rich-1/diff", 400),
        ("/admin/session/rich-1/diff?a=1&b=x", 400),
        ("/admin/session/rich-1/diff?a=1&b=3", 404),
        ("/admin/nothing/here", 404),
        ("/admin/static/../site.py", 404),
    ],
)
async def test_bad_input_is_400_or_404_page(tmp_path: Path, path: str, status: int) -> None:
    """Bad ids, numbers and names get a 400/404 HTML page, never a 500."""
    await rich_session(JsonlSessionStore(tmp_path))
    async with serve(site_for(tmp_path)) as viewer:
        got, page = await viewer.get(path)
    assert got == status
    assert page.startswith("<!doctype html>")
    assert f"{status} " in page


async def test_unreadable_log_is_422_and_problems_are_listed(tmp_path: Path) -> None:
    """An empty log is a 422 page; a corrupt line and a torn tail are shown as problems."""
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "empty.jsonl").write_bytes(b"")
    raw_session(tmp_path, "hurt", extra_lines=[b"{not json\n", b'{"type":"message","seq":3'])
    async with serve(site_for(tmp_path)) as viewer:
        empty, _ = await viewer.get("/admin/session/empty")
        status, page = await viewer.get("/admin/session/hurt")
    assert empty == 422
    assert status == 200
    assert "Torn tail" in page
    assert "Line 3" in page
    assert "not valid JSON" in page


async def test_seed_format_notices_are_shown(tmp_path: Path) -> None:
    """v1 logs say the prompt was not recorded; turns before the first prompt say so too."""
    folder = tmp_path / "sessions"
    folder.mkdir()
    shutil.copy(SEED_DIR / "v1-messages-only.jsonl", folder / "v1.jsonl")
    shutil.copy(SEED_DIR / "v2-late-prompt-torn-tail.jsonl", folder / "late.jsonl")
    async with serve(site_for(tmp_path)) as viewer:
        _, v1 = await viewer.get("/admin/session/v1")
        _, late = await viewer.get("/admin/session/late")
    assert "predates prompt recording" in v1
    assert "no prompt recorded before this call" in late
    assert "Torn tail" in late


async def test_static_assets_are_package_data_with_strict_headers(tmp_path: Path) -> None:
    """CSS and JS come from the package; pages forbid inline and foreign scripts."""
    async with serve(site_for(tmp_path)) as viewer:
        async with viewer.client.get(viewer.base + "/admin/static/admin.js") as resp:
            assert resp.status == 200
            assert resp.content_type == "text/javascript"
        async with viewer.client.get(viewer.base + "/admin/") as resp:
            headers: Any = resp.headers
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["Cache-Control"] == "no-store"
    assert COOKIE not in headers.get("Set-Cookie", "")


async def test_cross_origin_login_post_is_refused(tmp_path: Path) -> None:
    """A sign-in form posted from another origin (or an opaque one) is 403, no cookie."""
    async with serve(site_for(tmp_path, TOKEN)) as viewer:
        for origin in ("http://evil.example", "null"):
            async with viewer.client.post(viewer.base + "/admin/login",
                                          data={"token": TOKEN}, headers={"Origin": origin},
                                          allow_redirects=False) as resp:
                assert resp.status == 403
                assert "Set-Cookie" not in resp.headers
