"""The viewer's HTTP side: routes, the access guard, and the handlers behind each page.

Routes (all under ``/admin``; see :mod:`app.admin` for the rules)::

    GET  /admin/                            sessions list   ?tenant=&channel=&q=&page=
    GET  /admin/session/{id}                one session     ?tenant=&metric=
    GET  /admin/session/{id}/call/{n}       one provider call (``&fragment=1``: just its body)
    GET  /admin/session/{id}/turn/{n}       its old address: a permanent redirect to ``call/{n}``
    GET  /admin/session/{id}/diff?a=&b=     section diff of prompt versions a and b
    GET  /admin/usage                       cost per day (chart) and per session ?tenant=&days=
    GET  /admin/session/{id}/blob/{hash}    an attachment the session refers to (thumbnails)
    GET  /admin/login, POST /admin/login    the token form; sets the login cookie
    POST /admin/logout                      clears it
    GET  /admin/static/{name}               admin.css, admin.js (package data)

Bad input is a 400 page, an unknown session, call or version a 404 page, a log that cannot be
replayed a 422 page; no input makes a 500. The right token always signs in. A wrong one (sign-in
form or ``Bearer``) is counted per client and logged without the guess; after a few, that
client's next wrong guesses are answered 429 until its wait is over (:mod:`app.admin.throttle`).
A client is its address: the TCP peer's, or behind a proxy listed in
``GATEWAY_TRUSTED_PROXIES`` the one it forwards (:class:`gateway.edge.hosts.TrustedProxies`),
so one attacker behind the shared proxy never slows the operator. Signing out revokes the
cookie on the server (:class:`app.admin.auth.Revoked`). After signing in, the browser goes back
to the ``next`` page only if it is a path under ``/admin/`` once decoded and normalised. Pages are
rendered in a worker thread: replaying a big log is CPU work that must not stall the gateway's
channels.
"""

from __future__ import annotations

import asyncio
import logging
import math
import posixpath
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Protocol
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from aiohttp import web

from app.admin import urls
from app.admin.attachments import blob_response
from app.admin.auth import ALL_TENANTS, COOKIE, COOKIE_TTL, Access, Refused, Revoked
from app.admin.listing import ListQuery, list_page
from app.admin.markup import Markup
from app.admin.pages import Frame, error_page, login_page
from app.admin.render import Where, request_view
from app.admin.session_pages import (
    INLINE_BUDGET,
    SessionView,
    call_page,
    diff_page,
    session_page,
)
from app.admin.throttle import LoginThrottle
from app.admin.usage_page import days_of, usage_page
from gateway.edge.hosts import TrustedProxies, same_origin
from gateway.edge.http_limits import BodyRefused, read_body
from gateway.edge.signouts import SignOuts, SignOutsUnavailableError
from sessions.attachments import iter_refs, referenced
from sessions.blobs import BlobStore, load, validate_digest
from sessions.drift import DEFAULT_METRIC, METRICS, drift
from sessions.errors import (
    BlobCorruptError,
    BlobMissingError,
    InvalidNameError,
    SessionNotFoundError,
    SessionReadError,
)
from sessions.names import validate_session_id
from sessions.pricing import PriceTable
from sessions.replay import replay_bytes
from sessions.store import SessionInfo
from sessions.usage import aggregate, calls_of

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_ASSETS = {"admin.css": "text/css", "admin.js": "text/javascript"}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # a same-origin form post must carry its Origin
    "X-Frame-Options": "DENY",
}
MAX_QUERY_CHARS = 200
DEFAULT_USAGE_DAYS = 30
MAX_USAGE_DAYS = 366
MAX_NEXT = 2000
MAX_LOGIN_BODY = 16 * 1024
_QUERY_SAFE = "=&%+;:@/?!$'()*,-._~"  # a query's own syntax and escapes stay as they are


class SessionSource(Protocol):
    """The read side of a session store: all the viewer calls. It never writes a session."""

    async def list_sessions(self, tenant: str | None = None) -> list[SessionInfo]:
        """Sessions of one tenant (``None``: every tenant), newest first."""
        ...

    async def read_log(self, tenant: str, session_id: str) -> bytes:
        """The whole log as bytes; :class:`SessionNotFoundError` when there is none."""
        ...


def html(markup: Markup, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=markup, status=status, content_type="text/html", charset="utf-8",
                        headers={**_HEADERS, "Cache-Control": "no-store", **(headers or {})})


def _int(raw: str | None, what: str, default: int | None = None) -> int:
    if raw is None or raw == "":
        if default is None:
            raise Refused(400, f"{what} is required")
        return default
    if not raw.isdigit() or len(raw) > 9 or int(raw) < 1:
        raise Refused(400, f"{what} must be a whole number from 1")
    return int(raw)


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={**_HEADERS, "Location": location,
                                             "Cache-Control": "no-store"})


def _safe_next(value: str | None) -> str:
    """Where to go back to after signing in: only a page of the viewer (no open redirect).

    The path is decoded and normalised (``/admin/../x`` is ``/x``, so it is refused) and must
    stay under ``/admin/``; a scheme, a host, a backslash or any control character (CR/LF
    would split the ``Location`` header) sends the browser to ``/admin/`` instead. What is
    returned is re-encoded, so it is always one safe header value."""
    fallback = urls.index()
    if not value or len(value) > MAX_NEXT or "\\" in value or not value.isprintable():
        return fallback
    parts = urlsplit(value)
    path = unquote(parts.path)
    if parts.scheme or parts.netloc or "\\" in path or not path.isprintable():
        return fallback
    normal = posixpath.normpath(path)
    if path.endswith("/") and normal != "/":
        normal += "/"
    if not normal.startswith(f"{urls.PREFIX}/"):
        return fallback
    query = f"?{quote(parts.query, safe=_QUERY_SAFE)}" if parts.query else ""
    return quote(normal, safe="/") + query


class AdminSite:
    """The session viewer over a read-only :class:`SessionSource`, guarded by :class:`Access`."""

    def __init__(self, source: SessionSource, access: Access, *,
                 inline_budget: int = INLINE_BUDGET, prices: PriceTable | None = None,
                 blobs: BlobStore | None = None,
                 clock: Callable[[], float] = time.time,
                 proxies: TrustedProxies | None = None,
                 signouts: SignOuts | None = None) -> None:
        self.source = source
        self.proxies = proxies or TrustedProxies()
        self.signouts: SignOuts = signouts or Revoked()
        """Sign-outs: this process's (:class:`Revoked`) or, with several workers, the ones
        they share (the composition root's choice)."""
        self.blobs = blobs
        """Attachment bytes (thumbnails, exact request bodies); None: shown by hash only."""
        self.access = access
        self.prices = prices or PriceTable()
        self.throttle = LoginThrottle()
        self.inline_budget = inline_budget
        self.clock = clock
        """Wall clock: the usage page's last day is today's, in UTC (tests pin it)."""
        folder = resources.files("app.admin") / "static"
        # two small files, read once when the gateway is composed, never per request
        self._assets = {name: (folder / name).read_bytes() for name in _ASSETS}

    def routes(self) -> list[web.RouteDef]:
        p = urls.PREFIX
        return [
            web.get(p, self._to_index),
            web.get(f"{p}/", self._guard(self._index)),
            web.get(f"{p}/login", self._login_form),
            web.post(f"{p}/login", self._login),
            web.post(f"{p}/logout", self._logout),
            web.get(f"{p}/static/{{name}}", self._static),
            web.get(f"{p}/session/{{id}}", self._guard(self._session)),
            web.get(f"{p}/session/{{id}}/diff", self._guard(self._diff)),
            web.get(f"{p}/session/{{id}}/call/{{n}}", self._guard(self._call)),
            web.get(f"{p}/session/{{id}}/turn/{{n}}", self._old_call),
            web.get(f"{p}/usage", self._guard(self._usage)),
            web.get(f"{p}/session/{{id}}/blob/{{hash}}", self._guard(self._blob)),
            web.get(f"{p}/{{tail:.*}}", self._guard(self._not_found)),
        ]

    def application(self) -> web.Application:
        """A standalone app: these routes, and ``/`` sending the browser to ``/admin/``."""
        app = web.Application()
        app.router.add_get("/", self._to_index)
        app.router.add_routes(self.routes())
        return app

    # -- guard ---------------------------------------------------------------------------------

    def _frame(self, request: web.Request, tenant: str | None = None) -> Frame:
        return Frame(tenant=tenant, signed_in=COOKIE in request.cookies)

    def _guard(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            authorization = request.headers.get("Authorization", "")
            try:
                sign_in = self.access.authenticate(request.headers.get("Host", ""),
                                                   authorization, request.cookies.get(COOKIE))
                if sign_in is not None and await self._signed_out(sign_in):
                    raise Refused(401, "signed out: sign in with the admin token")
            except Refused as exc:
                if exc.status == 401 and authorization:
                    # A wrong token, like a wrong sign-in: throttled the same way.
                    waiting = self._throttled(request)
                    if waiting is not None:
                        return waiting
                    self._failed(request, "bearer token")
                if exc.status == 401:
                    return html(login_page(_safe_next(request.path_qs)), 401,
                                {"WWW-Authenticate": 'Bearer realm="gateway admin"'})
                return html(error_page(exc.status, str(exc)), exc.status)
            try:
                return await handler(request)
            except Refused as exc:
                return html(error_page(exc.status, str(exc), self._frame(request)), exc.status)
            except InvalidNameError as exc:
                return html(error_page(400, str(exc), self._frame(request)), 400)
            except SessionNotFoundError:
                return html(error_page(404, "No such session in this tenant.",
                                       self._frame(request)), 404)
            except SessionReadError as exc:
                return html(error_page(422, f"This log cannot be replayed: {exc}",
                                       self._frame(request)), 422)
            except web.HTTPException:
                raise
            except Exception:
                log.exception("admin: %s %s failed", request.method, request.path)
                return html(error_page(500, "The viewer failed on this page; see the log."), 500)

        return guarded

    def _one_tenant(self, request: web.Request) -> str:
        tenant = self.access.tenant_for(request.query.get("tenant"))
        if tenant == ALL_TENANTS:
            raise Refused(400, "a session belongs to one tenant: name it with ?tenant=")
        return tenant

    def _same_origin(self, request: web.Request) -> None:
        origin = request.headers.get("Origin")
        scheme = self.proxies.scheme(request.remote, request.scheme,
                                     request.headers.get("X-Forwarded-Proto"))
        if origin is not None and not same_origin(origin, scheme, request.host):
            raise Refused(403, "cross-origin form posts are not allowed")

    # -- login ---------------------------------------------------------------------------------

    async def _to_index(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(urls.index())

    async def _login_form(self, request: web.Request) -> web.StreamResponse:
        if self.access.token is None:
            raise web.HTTPFound(urls.index())
        return html(login_page(_safe_next(request.query.get("next"))))

    async def _login(self, request: web.Request) -> web.StreamResponse:
        if self.access.token is None:
            return _see_other(urls.index())
        try:
            self._same_origin(request)
        except Refused as exc:
            return html(error_page(exc.status, str(exc)), exc.status)
        try:
            form = dict(parse_qsl((await read_body(request, MAX_LOGIN_BODY)).decode(
                "utf-8", "replace"), keep_blank_values=True, max_num_fields=8))
        except BodyRefused as exc:
            return html(error_page(exc.status, str(exc)), exc.status)
        except ValueError:  # more fields than a sign-in form has
            return html(error_page(400, "This is not the sign-in form."), 400)
        given, target = form.get("token"), form.get("next")
        target_url = _safe_next(target)
        if given is None or not self.access.token_matches(given):
            # Only a wrong token waits: the right one signs in even while its client is
            # throttled (behind one proxy the operator shares it with whoever guesses).
            waiting = self._throttled(request)
            if waiting is not None:
                return waiting
            self._failed(request, "sign-in")
            return html(login_page(target_url, "That is not the admin token."), 401)
        self.throttle.succeeded(self._client(request))
        response = _see_other(target_url)
        response.set_cookie(COOKIE, self.access.issue_cookie(), max_age=COOKIE_TTL,
                            path=urls.PREFIX, httponly=True, samesite="Strict",
                            secure=request.secure)
        return response

    def _throttled(self, request: web.Request) -> web.Response | None:
        """The 429 page for a client that must wait before its next token guess, if it must."""
        wait = self.throttle.wait(self._client(request))
        if wait <= 0:
            return None
        seconds = math.ceil(wait)
        return html(login_page(urls.index(), f"Too many wrong tokens: try again in {seconds} s."),
                    429, {"Retry-After": str(seconds)})

    def _failed(self, request: web.Request, how: str) -> None:
        """Count a wrong token and log it: who and how often, never what was tried."""
        client = self._client(request)
        count = self.throttle.failed(client)
        log.warning("admin: wrong token (%s) from %s; %d in a row", how, client, count)

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        try:
            self._same_origin(request)
        except Refused as exc:
            return html(error_page(exc.status, str(exc)), exc.status)
        found = self.access.cookie_id(request.cookies.get(COOKIE, ""))
        if found is not None:  # a copy of the cookie is refused from now on, on every worker
            await self.signouts.revoke(*found)
        response = _see_other(f"{urls.PREFIX}/login")
        response.del_cookie(COOKIE, path=urls.PREFIX)
        return response

    async def _signed_out(self, sign_in: str) -> bool:
        """Whether ``sign_in`` was signed out; when that cannot be told (the shared set is
        away), the cookie is not taken: 503 (the bearer token still works)."""
        try:
            return await self.signouts.revoked(sign_in)
        except SignOutsUnavailableError as exc:
            raise Refused(503, "sign-ins cannot be checked right now; use the bearer token "
                               "or try again shortly") from exc

    def _client(self, request: web.Request) -> str:
        """Who a wrong token is counted against (module docstring)."""
        return self.proxies.client(request.remote,
                                   request.headers.getall("X-Forwarded-For", []))

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self._assets:
            return html(error_page(404, "No such file."), 404)
        return web.Response(body=self._assets[name], content_type=_ASSETS[name], charset="utf-8",
                            headers={**_HEADERS, "Cache-Control": "no-cache"})

    # -- pages ---------------------------------------------------------------------------------

    async def _not_found(self, request: web.Request) -> web.StreamResponse:
        return html(error_page(404, "No such page.", self._frame(request)), 404)

    async def _index(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        tenant = self.access.tenant_for(q.get("tenant"))
        query = ListQuery(
            tenant=tenant, home=self.access.home, channel=q.get("channel", "")[:MAX_QUERY_CHARS],
            text=q.get("q", "").strip()[:MAX_QUERY_CHARS], page=_int(q.get("page"), "page", 1),
            can_switch=self.access.pinned is None,
        )
        infos = await self.source.list_sessions(None if tenant == ALL_TENANTS else tenant)
        markup = await asyncio.to_thread(list_page, query, infos, self._frame(request, tenant))
        return html(markup)

    async def _load(self, request: web.Request) -> SessionView:
        tenant = self._one_tenant(request)
        session_id = validate_session_id(request.match_info["id"])
        data = await self.source.read_log(tenant, session_id)
        replay = await asyncio.to_thread(replay_bytes, data)
        return await asyncio.to_thread(
            SessionView.of, replay, Where(session_id, tenant, self.access.home), len(data),
            self._frame(request, tenant), self.prices)

    async def _session(self, request: web.Request) -> web.StreamResponse:
        metric = request.query.get("metric") or DEFAULT_METRIC
        if metric not in METRICS:  # never a "module:function" path from a URL
            raise Refused(400, f"unknown metric; choose one of {', '.join(METRICS)}")
        view = await self._load(request)

        def render() -> Markup:
            points = drift(view.replay, metric=metric)
            return session_page(view, points, metric, self.inline_budget)

        return html(await asyncio.to_thread(render))

    async def _call(self, request: web.Request) -> web.StreamResponse:
        number = _int(request.match_info["n"], "call number")
        view = await self._load(request)
        try:
            call = view.replay.call(number)
        except IndexError:
            raise Refused(404, f"This session has no call {number} "
                               f"(it has {len(view.replay.calls)}).") from None
        if request.query.get("fragment"):
            return html(await asyncio.to_thread(request_view, view.replay, call, view.where))
        found: dict[str, bytes] = {}
        refused: str | None = None
        refs = view.replay.attachments(call)
        if refs and self.blobs is not None:
            try:
                found = await load(self.blobs, view.where.tenant, refs)
            except BlobCorruptError as exc:  # never shown as if it were the file
                refused = str(exc)
        return html(await asyncio.to_thread(call_page, view, call, found, refused))

    async def _old_call(self, request: web.Request) -> web.StreamResponse:
        """``.../turn/N`` (bookmarks and links from before the page was named for calls): the same
        page at ``.../call/N``, query kept. Only the path changes, so nothing is checked here;
        the new address is guarded as usual."""
        old = request.rel_url
        path = old.path.rsplit("/turn/", 1)[0] + "/call/" + request.match_info["n"]
        raise web.HTTPMovedPermanently(old.with_path(path).with_query(old.query))

    async def _blob(self, request: web.Request) -> web.StreamResponse:
        """An attachment of a session the admin may see, only if that session refers to it."""
        digest = validate_digest(request.match_info["hash"])
        tenant = self._one_tenant(request)
        session_id = validate_session_id(request.match_info["id"])
        log_bytes = await self.source.read_log(tenant, session_id)
        if digest not in referenced(log_bytes) or self.blobs is None:
            raise Refused(404, "This session refers to no such file.")
        view = replay_bytes(log_bytes)
        name, media_type = "file", "application/octet-stream"
        for message in view.messages:
            for ref, _sent in iter_refs(message.get("content")):
                if ref.hash == digest:
                    name, media_type = ref.name, ref.media_type
        try:
            data = await self.blobs.get(tenant, digest)
        except BlobCorruptError:
            raise Refused(422, "This file is damaged in the blob store (its bytes no longer "
                               "match its hash), so it is not shown.") from None
        except BlobMissingError:
            raise Refused(404, "This file is no longer in the blob store.") from None
        return blob_response(data, media_type, name)

    async def _usage(self, request: web.Request) -> web.StreamResponse:
        tenant = self.access.tenant_for(request.query.get("tenant"))
        span = _int(request.query.get("days"), "days", DEFAULT_USAGE_DAYS)
        if span > MAX_USAGE_DAYS:
            raise Refused(400, f"days must be at most {MAX_USAGE_DAYS}")
        today = datetime.fromtimestamp(self.clock(), UTC).date()
        since = datetime.combine(today - timedelta(days=span - 1), datetime.min.time(), UTC)
        logs: list[bytes] = []
        for info in await self.source.list_sessions(None if tenant == ALL_TENANTS else tenant):
            if info.modified < since.timestamp():
                continue  # nothing in it was written in these days
            try:
                logs.append(await self.source.read_log(info.tenant, info.session_id))
            except (SessionNotFoundError, OSError):
                continue  # pruned meanwhile, or unreadable: the page shows what it can read
        cutoff = since.strftime("%Y-%m-%dT%H:%M:%S")
        frame = self._frame(request, tenant)

        def render() -> Markup:
            calls = []
            for data in logs:
                try:
                    calls += [c for c in calls_of(replay_bytes(data), self.prices)
                              if c.ts is not None and c.ts >= cutoff]
                except SessionReadError:
                    continue
            days = days_of(aggregate(calls, "day"), today, span)
            return usage_page(days, aggregate(calls, "session"), span, self.access.home, frame)

        return html(await asyncio.to_thread(render))

    async def _diff(self, request: web.Request) -> web.StreamResponse:
        a = _int(request.query.get("a"), "version a")
        b = _int(request.query.get("b"), "version b")
        view = await self._load(request)
        count = len(view.replay.prompts)
        if a > count or b > count:
            raise Refused(404, f"This session has {count} prompt version(s).")
        old, new = view.replay.prompts[a - 1], view.replay.prompts[b - 1]
        return html(await asyncio.to_thread(diff_page, view, old, new))
