"""The web channel: a small chat page and a JSON/SSE API on the gateway's own HTTP server.

Routes::

    GET  /                  the chat page (package data under ``static/``, no CDN)
    GET  /static/{name}     its scripts and stylesheets
    POST /api/chat          {"conversation", "text"[, "name", "id", "stream", "attachments"]}
                            (JSON, or the same fields as multipart/form-data with file parts)
    GET  /api/history       ?conversation=C[&offset=O&limit=N] -> the session's messages
    GET  /api/file          ?conversation=C&hash=H -> a file of that conversation

``POST /api/chat`` records the message, waits for its turn and answers
``{"session": id, "reply": text}`` (plus ``"files"`` when the agent sent some). Files come as
``"attachments": [{"name", "media_type", "data": base64}]`` in JSON, or as file parts of a
``multipart/form-data`` body (its text fields named like the JSON keys); the body may be as
large as one file at ``GATEWAY_MAX_ATTACHMENT_BYTES`` in base64 plus 1 MiB (other routes:
2 MiB). With ``"stream": true`` (or ``Accept: text/event-stream``) it answers Server-Sent
Events instead; every ``data`` line is one JSON object::

    event: session  data: {"session": id}
    event: delta    data: {"text": chunk}                  zero or more, as the provider streams
    event: retract  data: {}                               drop the deltas so far (their worker
                                                           lost the conversation; another answers)
    event: file     data: {"name", "media_type", "size", "hash", "url"}   a file the agent sent
    event: done     data: {"session": id, "reply": text}   the final text supersedes the deltas
    event: error    data: {"session": id, "error": message, "status": code}

``GET /api/file`` serves a file only when the conversation's current session refers to it
(the person's own attachments, files the agent sent): images inline, everything else as a
download, always with ``nosniff`` and a sandboxing CSP (no uploaded file runs as a page here).

Errors before the stream starts are plain JSON ``{"error": ...}`` with an HTTP status: 400 bad
input, 401 missing token, 403 foreign origin, 408 body not sent in time
(``GATEWAY_HTTP_TIMEOUT``), 413 too long, 502 the turn apologised, 503 the message could not be
recorded (``{"error": "store unavailable"}`` or ``"coordination unavailable"``, with
``Retry-After``) or the gateway is shutting down, 504 no reply in time (it will be in the
history). Bad input never gets a 500. A reply always names its session.

With several workers the reply comes from whichever worker serves the conversation, relayed
through Redis; a request still waiting looks its answer up in the session log every
:data:`LOST_REPLY_CHECK` seconds (1), so a reply lost on its way (Redis restarted or flushed,
or the serving worker killed right after recording it) is sent from there within two looks of
being recorded (a look is one small read; the log itself is read once it moved and then stayed
still: ``Router._watch``).

Idempotent on the client's message id (``"id"``, scoped to its conversation): sending the same
id again (a retry after a lost connection) records nothing new and answers with what the first
delivery got, waiting for it if its turn is still running.

Who is talking: the server says (:mod:`channels.web.identity`): the token's user, the browser
of the ``gateway_web`` cookie the page sets, or, for a request without one, its address; never
the conversation id. A conversation id is the person's own: the gateway keys it
``<person>.<conversation>`` (:func:`~channels.web.convert.own_conversation`), so two people
who pick the same id have two conversations and neither sees the other's history or files.
The web chat is its own tenant (``web`` unless ``GATEWAY_WEB_TENANT``
says otherwise), apart from Telegram's and every Slack workspace's sessions and budgets.

Security: the gateway binds 127.0.0.1 by default. Bound anywhere else, :meth:`WebChannel.start`
refuses to run without ``GATEWAY_WEB_TOKEN``; with a token every ``/api`` route needs
``Authorization: Bearer <token>``. Without a token the API answers only requests whose ``Host``
is a loopback name (DNS rebinding) and whose ``Origin``, when sent, is this server, scheme
included (CSRF from other sites open in the same browser).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

from aiohttp import web

from channels.web import sse
from channels.web.api import dumps, error, guard
from channels.web.convert import (
    BadRequest,
    ChatRequest,
    blob_hash,
    chat_request,
    conversation_id,
    form_attachments,
    form_fields,
    history_item,
    int_param,
    own_conversation,
    parse_chat,
)
from channels.web.identity import COOKIE, COOKIE_MAX_AGE, WebIdentities
from channels.web.page import ASSETS, PAGE_HEADERS, load_assets, with_replay
from channels.web.sink import WebSink
from channels.web.waiting import LOST_REPLY_CHECK, Pending, looking_up, session_of
from gateway.edge.channel import Accepted, Deliver, ReplySink, RouterClosedError
from gateway.edge.errors import ConfigError, UnavailableError
from gateway.edge.history import History
from gateway.edge.hosts import TrustedProxies, is_loopback
from gateway.edge.http_limits import body_timeout
from gateway.edge.ids import WEB_TENANT
from gateway.edge.messages import ConversationKey, Inbound, Sender

CHANNEL = "web"
MAX_HISTORY_PAGE = 200


class WebChannel:
    """Browser chat and HTTP API; implements ``Channel`` and ``HttpChannel``."""

    name = CHANNEL

    def __init__(
        self,
        *,
        history: History,
        host: str = "127.0.0.1",
        token: str | None = None,
        max_message_chars: int = 16_000,
        reply_timeout: float = 90.0,
        shutdown_grace: float = 10.0,
        lost_reply_check: float = LOST_REPLY_CHECK,
        tenant: str = WEB_TENANT,
        max_body_bytes: int = 2 * 1024 * 1024,
        replay_command: str = "gateway replay {session}",
        identities: WebIdentities | None = None,
        proxies: TrustedProxies | None = None,
    ) -> None:
        self.history = history
        self.max_body_bytes = max_body_bytes
        """The largest ``POST /api/chat`` body: room for attachments (other routes: 2 MiB)."""
        self.host = host
        self.max_message_chars = max_message_chars
        self.reply_timeout = reply_timeout
        self.shutdown_grace = shutdown_grace
        self.lost_reply_check = lost_reply_check
        self.tenant = tenant
        self._token = token.encode() if token else None
        # Without a key from the composition root (tests), one for this process only.
        self.identities = identities or WebIdentities(secrets.token_bytes(32),
                                                      token=self._token)
        self.proxies = proxies or TrustedProxies()
        self._assets = load_assets()  # a few small files, read once at composition time
        # The page's replay hint, as the operator types it here (``.venv/bin/gateway ...``).
        self._assets["index.html"] = with_replay(self._assets["index.html"], replay_command)
        self._deliver: Deliver | None = None
        self._pending: dict[str, Pending] = {}
        # A request's id travels with its message (the owed journal keeps it; another worker
        # may serve it), so it must be unique beyond this process: a plain counter restarts
        # at 1, and a message owed from the last run would be answered into the request that
        # happens to hold its old number (found by the crash-kill trials).
        self._run = secrets.token_hex(8)
        self._ids = itertools.count(1)
        self._requests = 0
        self._close_at: float | None = None

    # -- Channel ------------------------------------------------------------------------------

    async def start(self, deliver: Deliver) -> None:
        """Refuse a non-loopback bind without a token; otherwise take requests."""
        if self._token is None and not is_loopback(self.host):
            raise ConfigError(
                f"GATEWAY_HOST={self.host} is not a loopback address and GATEWAY_WEB_TOKEN is "
                "not set; set a token to serve the web chat beyond this machine"
            )
        self._deliver = deliver

    def reply_sink(self, inbound: Inbound) -> ReplySink:
        """The sink registered for the request that produced ``inbound``."""
        pending = self._pending.get(str(inbound.meta.get("web_request")))
        if pending is not None:
            return pending.sink
        # Not from a live request (it timed out or came from elsewhere): nobody listens.
        return WebSink(stream=False)

    def waiting(self) -> list[ReplySink]:
        """The reply sinks of the requests waiting for their answer now, oldest first: what
        a retract or a shutdown reaches (the tests retract a streamed reply through this)."""
        return [pending.sink for pending in self._pending.values()]

    def health(self) -> Mapping[str, Any]:
        return {"ok": True, "requests": self._requests}

    async def aclose(self) -> None:
        """Stop taking messages; waiting requests get the shutdown grace, then 503."""
        if self._close_at is not None:
            return
        loop = asyncio.get_running_loop()
        self._close_at = loop.time() + self.shutdown_grace + 1.0
        for pending in self._pending.values():
            timer = pending.timer
            if timer is not None and (timer.when() or float("inf")) > self._close_at:
                timer.reschedule(self._close_at)

    # -- HttpChannel --------------------------------------------------------------------------

    def routes(self) -> Iterable[web.AbstractRouteDef]:
        return [
            web.get("/", self._page),
            web.get("/static/{name}", self._static),
            web.post("/api/chat", self._api(self._chat)),
            web.get("/api/history", self._api(self._history)),
            web.get("/api/file", self._api(self._file)),
        ]

    async def _page(self, request: web.Request) -> web.Response:
        response = self._asset("index.html")
        identity = self.identities.for_page(request.cookies.get(COOKIE), self._address(request))
        if identity.cookie is not None:
            response.set_cookie(COOKIE, identity.cookie, max_age=COOKIE_MAX_AGE, path="/",
                                httponly=True, samesite="Strict", secure=request.secure)
        return response

    def _person(self, request: web.Request) -> str:
        return self.identities.of(request.cookies.get(COOKIE), self._address(request))

    def _key(self, person: str, conversation: str) -> ConversationKey:
        """The conversation ``conversation`` of ``person`` (:func:`own_conversation`)."""
        return ConversationKey(CHANNEL, own_conversation(person, conversation),
                               tenant=self.tenant)

    def _address(self, request: web.Request) -> str:
        """The client's address (behind a trusted proxy, the one it forwards)."""
        return self.proxies.client(request.remote,
                                   request.headers.getall("X-Forwarded-For", []))

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == "index.html" or name not in self._assets:
            return error(404, "no such file")
        return self._asset(name)

    def _asset(self, name: str) -> web.Response:
        return web.Response(body=self._assets[name], content_type=ASSETS[name],
                            charset="utf-8", headers=PAGE_HEADERS)

    def _api(
        self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        return guard(handler, self._token, self.proxies)

    # -- POST /api/chat -----------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self._requests += 1
        if self._deliver is None or self._close_at is not None:
            return error(503, "the gateway is not taking messages")
        chat = await self._read_chat(request)
        stream = chat.stream or "text/event-stream" in request.headers.get("Accept", "")
        rid = f"{self._run}-{next(self._ids)}"
        # The person is whom the server says (channels/web/identity.py), never the
        # conversation id the client picks: limits, budgets and memory are theirs, and so is
        # the conversation (another person's same id is another conversation).
        person = self._person(request)
        inbound = Inbound(
            key=self._key(person, chat.conversation),
            sender=Sender(id=person, name=chat.name),
            text=chat.text,
            platform_id=chat.client_id,
            chat_type="private",
            received_at=time.time(),
            meta={"web_request": rid},
            attachments=chat.attachments,
        )
        pending = Pending(WebSink(stream=stream, conversation=chat.conversation))
        self._pending[rid] = pending
        try:
            try:
                accepted = await self._deliver(inbound, pending.sink)
            except RouterClosedError:
                return error(503, "the gateway is shutting down", retry=True)
            except UnavailableError as exc:
                return error(503, exc.public, retry=True)
            if not isinstance(accepted, Accepted):  # access control refused it
                return error(403, "this message was not accepted")
            if accepted.duplicate:
                return await self._again(request, pending, accepted, stream)
            async with looking_up(pending, accepted, self.lost_reply_check):
                if stream:
                    return await sse.stream(request, pending, accepted, self._timer, self._late)
                return await self._wait(pending, accepted)
        finally:
            del self._pending[rid]

    async def _again(self, request: web.Request, pending: Pending, accepted: Accepted,
                     stream: bool) -> web.StreamResponse:
        """A message id received before: answer with what that delivery got (waiting for
        it), as the first request would have."""
        assert accepted.earlier is not None, "a duplicate carries its earlier answer"
        try:
            async with self._timer(pending):
                answer = await accepted.earlier(self.reply_timeout)
        except TimeoutError:
            answer = None
        if answer is None:
            status, body = self._late(accepted.session_id)
            return web.json_response(body, status=status, dumps=dumps)
        if answer.ok:
            await pending.sink.finish(answer.text)
        else:
            await pending.sink.fail(answer.text)
        again = Accepted(session_id=answer.session_id)
        if stream:
            return await sse.stream(request, pending, again, self._timer, self._late)
        return await self._wait(pending, again)

    async def _read_chat(self, request: web.Request) -> ChatRequest:
        """The request's body, JSON or multipart, read within the chat route's own limit."""
        big = request.clone(client_max_size=self.max_body_bytes)
        try:
            async with asyncio.timeout(body_timeout(request)):
                return await self._parse_chat(big)
        except TimeoutError:
            raise BadRequest("request body not received in time", 408) from None

    async def _parse_chat(self, big: web.Request) -> ChatRequest:
        try:
            if big.content_type == "multipart/form-data":
                form = await big.post()
                fields = {k: v for k, v in form.items() if isinstance(v, str)}
                files = []
                for value in form.values():
                    if isinstance(value, web.FileField):
                        with value.file:  # aiohttp spools parts to temporary files
                            files.append((value.filename, value.content_type, value.file.read()))
                return chat_request(form_fields(fields), form_attachments(files),
                                    self.max_message_chars)
            raw = await big.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise BadRequest(f"request body is too large ({exc.text})", 413) from exc
        except ValueError as exc:  # a multipart body aiohttp cannot parse
            raise BadRequest("request body is not valid multipart/form-data") from exc
        return parse_chat(raw, self.max_message_chars)

    def _timer(self, pending: Pending) -> asyncio.Timeout:
        when = asyncio.get_running_loop().time() + self.reply_timeout
        if self._close_at is not None:
            when = min(when, self._close_at)
        pending.timer = asyncio.timeout_at(when)
        return pending.timer

    def _late(self, session: str | None) -> tuple[int, dict[str, Any]]:
        named = {} if session is None else {"session": session}
        if self._close_at is not None:
            return 503, {**named, "error": "the gateway shut down before the reply"}
        return 504, {**named, "error": "no reply in time; it will be in the history"}

    async def _wait(self, pending: Pending, accepted: Accepted) -> web.Response:
        try:
            async with self._timer(pending):
                ok, text = await pending.sink.result
                # Recorded before its reply went out, so this is at hand by now.
                session = await session_of(accepted, pending, self.reply_timeout)
        except TimeoutError:
            status, body = self._late(accepted.session_id)
            return web.json_response(body, status=status, dumps=dumps)
        if session is None and accepted.recorded is None:  # a command: nothing recorded
            return web.json_response({"reply": text} if ok else {"error": text},
                                     status=200 if ok else 502, dumps=dumps)
        if session is None:  # the record's notice was lost (a relay outage): say so
            status, body = self._late(None)
            return web.json_response(body, status=status, dumps=dumps)
        if not ok:
            return web.json_response({"session": session, "error": text}, status=502,
                                     dumps=dumps)
        answer: dict[str, Any] = {"session": session, "reply": text}
        if pending.sink.files:  # files the agent sent, as download links
            answer["files"] = pending.sink.files
        return web.json_response(answer, dumps=dumps)

    # -- GET /api/history ---------------------------------------------------------------------

    async def _history(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        conversation = conversation_id(query.get("conversation"))
        offset = int_param(query, "offset", 0)
        limit = min(int_param(query, "limit", 50), MAX_HISTORY_PAGE)
        key = self._key(self._person(request), conversation)
        page = await self.history.page(key, offset, limit)
        return web.json_response({
            "session": page.session,
            "total": page.total,
            "offset": page.offset,
            "messages": [history_item(item, conversation) for item in page.items],
        }, dumps=dumps)

    # -- GET /api/file ------------------------------------------------------------------------

    async def _file(self, request: web.Request) -> web.StreamResponse:
        conversation = conversation_id(request.query.get("conversation"))
        digest = blob_hash(request.query.get("hash"))
        key = self._key(self._person(request), conversation)
        found = await self.history.file(key, digest)
        if found is None:
            return error(404, "no such file in this conversation")
        inline = found.media_type in _INLINE_TYPES
        disposition = "inline" if inline else "attachment"
        return web.Response(body=found.data, headers={
            "Content-Type": found.media_type if inline else "application/octet-stream",
            "Content-Disposition": f"{disposition}; filename*=UTF-8''{quote(found.name)}",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private, max-age=3600",
        })


_INLINE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Shown in the page (thumbnails); every other file is served as a download only."""
