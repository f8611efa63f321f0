"""A local fake of the Slack Web API, Events API delivery and Socket Mode.

Point the real slack_sdk / slack_bolt clients at it::

    async with FakeSlackServer() as slack:
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_base_url)
        await client.chat_postMessage(channel="C0FAKEGEN", text="hi")

Only 127.0.0.1 is used. Behaviour kept from the real service: Bearer-token auth with
``invalid_auth``/``not_authed``/``not_allowed_token_type``, errors as ``{"ok": false}``
bodies with HTTP 200, rate limits as HTTP 429 plus ``Retry-After``, monotonically
increasing message ``ts``, signed event deliveries (``v0`` HMAC-SHA256) with retry
headers, two events (``app_mention`` + ``message``) for one channel mention, and a
Socket Mode WebSocket that greets with ``hello`` and expects envelope acks. Files: hosted
at ``url_private_download`` (``/files-pri/...``; without the bot token a redirect to the
sign-in page, as Slack answers), every download recorded with the token it carried (and held
while ``downloads`` is closed, for tests of what happens meanwhile), file
events (:meth:`FakeSlackServer.file_event`), and the upload v2 flow
(``files.getUploadURLExternal``, the upload URL, ``files.completeUploadExternal``).
Reading back: ``conversations.history`` (top-level messages, newest first) and
``conversations.replies`` (a thread, parent first) with ``oldest``/``latest``/``inclusive``,
``limit`` and cursors, and message metadata (``chat.postMessage``/``chat.update`` keep it; an
update without it leaves it intact) returned only with ``include_all_metadata``. Every answer
to the bot token carries the token's scopes (``x-oauth-scopes``; :attr:`scopes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import urlencode

import aiohttp
import orjson
from aiohttp import web

from tests.fakes.hold import Dropped, OutboundHold
from tests.waiting import WAIT

JSONDict = dict[str, Any]
MethodHandler = Callable[[JSONDict], Awaitable[JSONDict]]

BOT_SCOPES = frozenset({"app_mentions:read", "channels:history", "chat:write", "commands",
                        "files:read", "files:write", "groups:history", "im:history",
                        "mpim:history", "reactions:write", "users:read"})
MAX_TEXT_CHARS = 40_000
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3_000

# Form-encoded requests carry these as JSON strings (slack_sdk does so for files.* etc.).
_JSON_FIELDS = frozenset({"blocks", "attachments", "metadata", "user_auth_blocks", "files"})
_APP_TOKEN_METHODS = frozenset({"apps.connections.open"})
_MENTION_TOKEN_RE = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")


class SlackError(Exception):
    """An ``{"ok": false, "error": ...}`` answer; raise it from handlers."""

    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.extra = extra


@dataclass
class SlackCall:
    """One Web API request the client made."""

    method: str
    params: JSONDict
    token: str | None
    http_status: int
    response: JSONDict
    time: float

    @property
    def ok(self) -> bool:
        return bool(self.response.get("ok"))

    @property
    def error(self) -> str | None:
        return None if self.ok else self.response.get("error")

    @property
    def channel(self) -> str | None:
        """The resolved channel id when the call succeeded, else what was requested."""
        return self.response.get("channel") or self.params.get("channel")

    @property
    def text(self) -> str | None:
        return self.params.get("text")

    @property
    def thread_ts(self) -> str | None:
        return self.params.get("thread_ts")

    @property
    def ts(self) -> str | None:
        return self.response.get("ts")


@dataclass
class EventDelivery:
    """One Events API POST made by ``deliver_event``/``deliver_interactive``."""

    url: str
    body: bytes
    headers: dict[str, str]
    status: int
    response_body: str
    time: float


@dataclass
class _Fault:
    error: str
    status: int
    retry_after: int | None
    remaining: int


class _Pulse:
    """Broadcast "something changed" to any number of waiters, usable from sync code."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seconds: float | None) -> None:
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)


class FakeSlackServer:
    """In-process Slack API on 127.0.0.1 with recording, fault injection and event delivery.

    Behaviour notes:
      * channels and users must be known (builders and ``add_channel``/``add_user``
        register them) or ``channel_not_found``/``user_not_found`` is answered;
        ``strict_channels=False`` registers unknown channel ids on first use;
      * ``chat.postMessage`` to a user id opens (and answers with) that user's IM "D..." id;
      * ``conversations.open`` with one user answers the bot's IM with them (``{"id": "D..."}``,
        ``already_open``/``no_op`` when it existed; the full IM with ``return_im``); several
        users open a multi-person DM; unknown or deactivated users, a missing ``users``, a
        ``channel`` that is not an IM, more than 8 users are Slack's errors; every call is
        in ``calls`` (:meth:`opened` lists whom a DM was opened with, and where);
      * event builders return full ``event_callback`` envelopes, so re-delivering the
        same dict is a faithful Slack retry (same ``event_id``);
      * messages from builders are stored, so ``reactions.add`` on a user's ts works.
    """

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-fake-bot-token",
        app_token: str = "xapp-1-fake-app-token",
        signing_secret: str = "fake-signing-secret",
        verification_token: str = "fake-verification-token",
        team_id: str = "T0FAKETEAM",
        team_name: str = "Fake Team",
        bot_user_id: str = "U0FAKEBOT",
        bot_id: str = "B0FAKEBOT",
        bot_name: str = "fakebot",
        app_id: str = "A0FAKEAPP",
        strict_channels: bool = True,
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.last_headers: dict[str, str] = {}  # of the last deliver_event answer
        self.verification_token = verification_token
        self.team_id = team_id
        self.team_name = team_name
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.bot_name = bot_name
        self.app_id = app_id
        self.strict_channels = strict_channels
        self.scopes: set[str] = set(BOT_SCOPES)
        """The bot token's scopes, sent as ``x-oauth-scopes`` (a test may take some away)."""

        # Recording
        self.calls: list[SlackCall] = []
        self.deliveries: list[EventDelivery] = []
        self.socket_acks: list[JSONDict] = []
        self.socket_received: list[JSONDict] = []
        self.socket_sent: list[JSONDict] = []
        self.socket_connections = 0  # total accepted, including closed ones
        self.socket_connected = asyncio.Event()  # set while at least one socket is open

        # State
        self.users: dict[str, JSONDict] = {}
        self.channels: dict[str, JSONDict] = {}
        self.messages: dict[tuple[str, str], JSONDict] = {}
        self.reactions: dict[tuple[str, str], set[str]] = {}
        self.hosted: dict[str, bytes] = {}  # /files-pri/... path -> bytes
        self.file_downloads: list[tuple[str, str | None]] = []  # (path, Authorization header)
        self.moved: dict[str, str] = {}  # hosted path -> path it redirects to
        self.uploads: dict[str, JSONDict] = {}  # file id -> {"filename", "length", "data"}
        self.shared_files: list[JSONDict] = []  # completed uploads, with channel and thread
        self._file_seq = itertools.count(1)
        self._last_ts_us = 0
        self._event_seq = itertools.count(1)
        self._faults: dict[str, list[_Fault]] = {}
        self._delays: dict[str, list[list[float]]] = {}
        self._holds: dict[str, list[asyncio.Event]] = {}
        self.held_now: list[str] = []
        """Methods whose call waits at a :meth:`hold_next` gate now (one entry per call)."""
        self.outbound = OutboundHold(frozenset({
            "chat.postMessage", "chat.update", "chat.delete", "files.completeUploadExternal"}))
        """Hold replies (see :mod:`tests.fakes.hold`)."""
        self.downloads = OutboundHold(frozenset({"file"}))
        """Hold file downloads (``/files-pri/``): a held one waits after it is recorded in
        ``file_downloads``; one dropped is answered 502 (see :mod:`tests.fakes.hold`)."""
        self.files_served: list[str] = []  # paths whose bytes were sent
        self._tickets: set[str] = set()
        self._sockets: list[web.WebSocketResponse] = []
        self._calls_pulse = _Pulse()
        self._acks_pulse = _Pulse()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port: int | None = None
        self._methods: dict[str, MethodHandler] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.delete": self._chat_delete,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "reactions.add": self._reactions_add,
            "reactions.remove": self._reactions_remove,
            "users.info": self._users_info,
            "conversations.info": self._conversations_info,
            "conversations.open": self._conversations_open,
            "conversations.history": self._conversations_history,
            "conversations.replies": self._conversations_replies,
            "apps.connections.open": self._apps_connections_open,
            "files.getUploadURLExternal": self._files_get_upload_url,
            "files.completeUploadExternal": self._files_complete_upload,
        }
        self.add_user(bot_user_id, name=bot_name, is_bot=True)

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_get("/link/", self._handle_socket)
        app.router.add_get("/files-pri/{tail:.+}", self._handle_file_download)
        app.router.add_post("/upload/v1/{file_id}", self._handle_upload)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for ws in list(self._sockets):
            await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutdown")
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeSlackServer is not started (use 'async with')")
        return self._port

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base_url(self) -> str:
        """For ``AsyncWebClient(base_url=...)`` (trailing slash required by slack_sdk)."""
        return f"{self.root_url}/api/"

    # ----------------------------------------------------------------- registry

    def add_user(
        self,
        user_id: str,
        *,
        name: str | None = None,
        real_name: str | None = None,
        is_bot: bool = False,
        tz: str = "UTC",
    ) -> JSONDict:
        """Register (or return) a user for users.info and event builders."""
        if user_id in self.users:
            return self.users[user_id]
        name = name or f"user_{user_id.lower()}"
        real_name = real_name or name.replace("_", " ").title()
        profile: JSONDict = {
            "real_name": real_name,
            "real_name_normalized": real_name,
            "display_name": name,
            "display_name_normalized": name,
            "team": self.team_id,
        }
        if is_bot:
            profile["bot_id"] = self.bot_id
        user = {
            "id": user_id,
            "team_id": self.team_id,
            "name": name,
            "deleted": False,
            "real_name": real_name,
            "tz": tz,
            "tz_offset": 0,
            "profile": profile,
            "is_admin": False,
            "is_owner": False,
            "is_bot": is_bot,
            "is_app_user": False,
            "updated": int(time.time()),
        }
        self.users[user_id] = user
        return user

    def add_channel(
        self,
        channel_id: str,
        *,
        name: str | None = None,
        is_private: bool = False,
        im_user: str | None = None,
    ) -> JSONDict:
        """Register (or return) a conversation; ``im_user`` makes it a DM with that user."""
        if channel_id in self.channels:
            return self.channels[channel_id]
        if im_user is not None:
            channel: JSONDict = {
                "id": channel_id,
                "created": int(time.time()),
                "is_im": True,
                "is_org_shared": False,
                "user": im_user,
                "is_user_deleted": False,
                "priority": 0,
            }
        else:
            name = name or channel_id.lower()
            channel = {
                "id": channel_id,
                "name": name,
                "name_normalized": name,
                "created": int(time.time()),
                "is_channel": not is_private,
                "is_group": is_private,
                "is_im": False,
                "is_mpim": False,
                "is_private": is_private,
                "is_archived": False,
                "is_general": name == "general",
                "is_member": True,
                "is_shared": False,
                "is_ext_shared": False,
                "is_org_shared": False,
            }
        self.channels[channel_id] = channel
        return channel

    def im_channel_for(self, user: str) -> str:
        """The DM conversation id between the bot and ``user`` (created on demand)."""
        for channel in self.channels.values():
            if channel.get("is_im") and channel.get("user") == user:
                return str(channel["id"])
        self.add_user(user)
        channel_id = "D" + user[1:]
        self.add_channel(channel_id, im_user=user)
        return channel_id

    def next_ts(self) -> str:
        """A fresh message ts: wall-clock based, strictly increasing, 6 decimals."""
        now_us = int(time.time() * 1_000_000)
        self._last_ts_us = max(now_us, self._last_ts_us + 100)
        return f"{self._last_ts_us // 1_000_000}.{self._last_ts_us % 1_000_000:06d}"

    # ----------------------------------------------------------------- recording helpers

    def posts(self, channel: str | None = None, thread_ts: str | None = None) -> list[SlackCall]:
        """Successful chat.postMessage calls, optionally filtered by channel / thread."""
        return [
            call
            for call in self.calls
            if call.method == "chat.postMessage"
            and call.ok
            and (channel is None or channel in (call.channel, call.params.get("channel")))
            and (thread_ts is None or call.thread_ts == thread_ts)
        ]

    def calls_of(self, method: str) -> list[SlackCall]:
        return [call for call in self.calls if call.method == method]

    async def wait_for_call(
        self,
        predicate_or_count: Callable[[SlackCall], bool] | int,
        timeout: float = WAIT,  # noqa: ASYNC109 - a plain float is the friendlier test API
    ) -> list[SlackCall]:
        """Wait until ``len(calls) >= n`` or some call matches; returns the matches."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if isinstance(predicate_or_count, int):
                if len(self.calls) >= predicate_or_count:
                    return list(self.calls)
            else:
                matches = [call for call in self.calls if predicate_or_count(call)]
                if matches:
                    return matches
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                seen = [(c.method, c.channel, c.text, c.error) for c in self.calls]
                raise TimeoutError(f"no matching Slack API call within {timeout}s; saw {seen}")
            await self._calls_pulse.wait(remaining)

    # ----------------------------------------------------------------- fault injection

    def fail_next(
        self,
        method: str,
        error: str = "ratelimited",
        status: int | None = None,
        retry_after: int | None = 1,
        times: int = 1,
    ) -> None:
        """Fail the next ``times`` calls of ``method`` ("*" = any).

        ``error="ratelimited"`` answers HTTP 429 with ``Retry-After`` like Slack; any other
        error answers HTTP 200 ``{"ok": false, "error": error}`` unless ``status`` is given.
        """
        if status is None:
            status = 429 if error == "ratelimited" else 200
        fault = _Fault(error, status, retry_after if status == 429 else None, times)
        self._faults.setdefault(method, []).append(fault)

    def delay_next(self, method: str, seconds: float, times: int = 1) -> None:
        """Hold the next ``times`` calls of ``method`` for ``seconds``."""
        self._delays.setdefault(method, []).append([seconds, times])

    def hold_next(self, method: str) -> asyncio.Event:
        """Hold the next call of ``method`` until the returned event is set (ordering tests
        without timing: what happened while the call was held)."""
        gate = asyncio.Event()
        self._holds.setdefault(method, []).append(gate)
        return gate

    def add_method(self, name: str, handler: MethodHandler) -> None:
        """Serve an extra Web API method; handler gets params, returns the body sans "ok"."""
        self._methods[name] = handler

    # ----------------------------------------------------------------- Web API

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params = await _read_params(request)
        token = _bearer_token(request) or params.pop("token", None)

        status = 200
        headers: dict[str, str] = {}
        try:
            handler = self._methods.get(method)
            if handler is None:
                raise SlackError("unknown_method", req_method=method)
            self._check_token(method, token)
            await self._apply_delay(method)
            try:
                await self.outbound.passage(method, params)
            except Dropped:
                return web.Response(status=502, text="dropped")
            fault = self._take_fault(method)
            if fault is not None:
                status = fault.status
                if fault.retry_after is not None:
                    headers["Retry-After"] = str(fault.retry_after)
                raise SlackError(fault.error)
            body: JSONDict = {"ok": True, **await handler(params)}
            self.outbound.applied(method, params, body)
        except SlackError as exc:
            body = {"ok": False, "error": exc.error, **exc.extra}
        if token == self.bot_token:  # as Slack does on every Web API answer to a bot token
            headers["x-oauth-scopes"] = ",".join(sorted(self.scopes))
        self.calls.append(SlackCall(method, params, token, status, body, time.time()))
        self._calls_pulse.fire()
        return web.Response(
            body=orjson.dumps(body), status=status, headers=headers, content_type="application/json"
        )

    def _check_token(self, method: str, token: str | None) -> None:
        if not token:
            raise SlackError("not_authed")
        if token not in (self.bot_token, self.app_token):
            raise SlackError("invalid_auth")
        # App-level tokens only open sockets; bot tokens cannot open them.
        if (token == self.app_token) != (method in _APP_TOKEN_METHODS):
            raise SlackError("not_allowed_token_type")

    async def _apply_delay(self, method: str) -> None:
        held = self._holds.get(method)
        if held:
            self.held_now.append(method)
            try:
                await held.pop(0).wait()
            finally:
                self.held_now.remove(method)
        for key in (method, "*"):
            queue = self._delays.get(key)
            if queue:
                seconds = queue[0][0]
                queue[0][1] -= 1
                if queue[0][1] <= 0:
                    queue.pop(0)
                await asyncio.sleep(seconds)
                return

    def _take_fault(self, method: str) -> _Fault | None:
        for key in (method, "*"):
            queue = self._faults.get(key)
            if queue:
                fault = queue[0]
                fault.remaining -= 1
                if fault.remaining <= 0:
                    queue.pop(0)
                return fault
        return None

    async def _auth_test(self, params: JSONDict) -> JSONDict:
        return {
            "url": f"https://{self.team_name.lower().replace(' ', '-')}.slack.com/",
            "team": self.team_name,
            "user": self.bot_name,
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    async def _chat_post_message(self, params: JSONDict) -> JSONDict:
        channel_id = self._resolve_channel(params.get("channel"))
        _validate_content(params)
        ts = self.next_ts()
        message = self._bot_message(params, ts)
        thread_ts = params.get("thread_ts")
        if thread_ts:
            message["thread_ts"] = str(thread_ts)
            parent = self.messages.get((channel_id, str(thread_ts)))
            if parent is not None:
                message["parent_user_id"] = parent.get("user")
                parent.setdefault("reply_count", 0)
                parent["reply_count"] += 1
        self.messages[(channel_id, ts)] = message
        return {"channel": channel_id, "ts": ts, "message": message}

    def _own_message(self, params: JSONDict, refusal: str) -> tuple[str, str, JSONDict]:
        """The bot's own message ``params`` name (a bot token changes only its own)."""
        channel_id = self._resolve_channel(params.get("channel"))
        ts = str(params.get("ts") or "")
        message = self.messages.get((channel_id, ts))
        if message is None:
            raise SlackError("message_not_found")
        if message.get("bot_id") != self.bot_id:
            raise SlackError(refusal)
        return channel_id, ts, message

    async def _chat_update(self, params: JSONDict) -> JSONDict:
        channel_id, ts, message = self._own_message(params, "cant_update_message")
        _validate_content(params)
        updated = self._bot_message(params, ts)
        for key in ("thread_ts", "parent_user_id", "reply_count"):
            if key in message:
                updated[key] = message[key]
        if "metadata" in message and not params.get("metadata"):
            updated["metadata"] = message["metadata"]  # left intact unless given (as Slack)
        updated["edited"] = {"user": self.bot_user_id, "ts": self.next_ts()}
        self.messages[(channel_id, ts)] = updated
        return {"channel": channel_id, "ts": ts, "text": updated["text"], "message": updated}

    async def _chat_delete(self, params: JSONDict) -> JSONDict:
        channel_id, ts, _ = self._own_message(params, "cant_delete_message")
        del self.messages[(channel_id, ts)]
        return {"channel": channel_id, "ts": ts}

    async def _chat_post_ephemeral(self, params: JSONDict) -> JSONDict:
        self._resolve_channel(params.get("channel"))
        user = params.get("user")
        if not user or user not in self.users:
            raise SlackError("user_not_found")
        _validate_content(params)
        return {"message_ts": self.next_ts()}

    async def _reactions_add(self, params: JSONDict) -> JSONDict:
        key, name = self._reaction_target(params)
        names = self.reactions.setdefault(key, set())
        if name in names:
            raise SlackError("already_reacted")
        names.add(name)
        return {}

    async def _reactions_remove(self, params: JSONDict) -> JSONDict:
        key, name = self._reaction_target(params)
        names = self.reactions.get(key, set())
        if name not in names:
            raise SlackError("no_reaction")
        names.discard(name)
        return {}

    def _reaction_target(self, params: JSONDict) -> tuple[tuple[str, str], str]:
        channel_id = self._resolve_channel(params.get("channel"))
        timestamp = str(params.get("timestamp") or "")
        if (channel_id, timestamp) not in self.messages:
            raise SlackError("message_not_found")
        name = str(params.get("name") or "")
        # Slack wants the bare name: ":eyes:" or "two words" are invalid_name.
        if not re.fullmatch(r"[a-z0-9_+'-]+(?:::skin-tone-[2-6])?", name):
            raise SlackError("invalid_name")
        return (channel_id, timestamp), name

    async def _users_info(self, params: JSONDict) -> JSONDict:
        user = self.users.get(str(params.get("user") or ""))
        if user is None:
            raise SlackError("user_not_found")
        return {"user": user}

    async def _conversations_info(self, params: JSONDict) -> JSONDict:
        channel = self.channels.get(str(params.get("channel") or ""))
        if channel is None:
            raise SlackError("channel_not_found")
        return {"channel": channel}

    async def _conversations_open(self, params: JSONDict) -> JSONDict:
        """Slack's ``conversations.open``: ``users`` (comma-separated ids; one user opens the
        1:1 IM, 2 to 8 a multi-person DM) or ``channel`` (an IM or MPIM id, resumed)."""
        channel_id = str(params.get("channel") or "")
        names = [u.strip() for u in str(params.get("users") or "").split(",") if u.strip()]
        if channel_id and not names:
            found = self.channels.get(channel_id)
            if found is None:
                raise SlackError("channel_not_found")
            if not (found.get("is_im") or found.get("is_mpim")):
                raise SlackError("method_not_supported_for_channel_type")
            return self._opened(found, params, existed=True)
        if not names:
            raise SlackError("users_list_not_supplied")
        if len(names) > 8:
            raise SlackError("too_many_users")
        for user in names:
            known = self.users.get(user)
            if known is None:
                raise SlackError("user_not_found")
            if known.get("deleted"):
                raise SlackError("user_disabled")
        if len(names) == 1:
            existed = any(c.get("is_im") and c.get("user") == names[0]
                          for c in self.channels.values())
            return self._opened(self.channels[self.im_channel_for(names[0])], params,
                                existed=existed)
        members = sorted({*names, self.bot_user_id})
        for channel in self.channels.values():
            if channel.get("is_mpim") and channel.get("members") == members:
                return self._opened(channel, params, existed=True)
        mpim_id = "G" + hashlib.sha256(",".join(members).encode()).hexdigest()[:10].upper()
        name = "mpdm-" + "--".join(self.users[m]["name"] for m in members) + "-1"
        channel = self.add_channel(mpim_id, name=name, is_private=True)
        channel.update({"is_group": False, "is_mpim": True, "members": members})
        return self._opened(channel, params, existed=False)

    @staticmethod
    def _opened(channel: JSONDict, params: JSONDict, *, existed: bool) -> JSONDict:
        full = str(params.get("return_im") or "").lower() in ("1", "true")
        body: JSONDict = {"channel": dict(channel) if full else {"id": channel["id"]}}
        if existed:
            body.update(no_op=True, already_open=True)
        return body

    def opened(self) -> list[tuple[str, str]]:
        """(users asked for, channel id answered) of every successful ``conversations.open``."""
        return [(str(call.params.get("users") or call.params.get("channel")),
                 str(call.response["channel"]["id"]))
                for call in self.calls_of("conversations.open") if call.ok]

    async def _conversations_history(self, params: JSONDict) -> JSONDict:
        """A channel's top-level messages (thread replies only as parents), newest first,
        between ``oldest`` and ``latest`` (exclusive unless ``inclusive``), ``limit`` a page
        (default 100, at most 999) with a cursor; metadata only with
        ``include_all_metadata``."""
        channel_id = self._known_channel(params)
        found = [m for (c, ts), m in self.messages.items() if c == channel_id
                 and m.get("thread_ts") in (None, ts) and _in_range(ts, params)]
        found.sort(key=lambda m: float(m["ts"]), reverse=True)
        return _page(found, params, default=100, most=999)

    async def _conversations_replies(self, params: JSONDict) -> JSONDict:
        """A thread: its parent first, then the replies (``oldest``/``latest`` applied to
        them) oldest first, ``limit`` a page (default and at most 1000) with a cursor;
        ``thread_not_found`` for a ts that is no message; metadata only with
        ``include_all_metadata``."""
        channel_id = self._known_channel(params)
        parent_ts = str(params.get("ts") or "")
        parent = self.messages.get((channel_id, parent_ts))
        if parent is None:
            raise SlackError("thread_not_found")
        replies = [m for (c, ts), m in self.messages.items() if c == channel_id
                   and ts != parent_ts and m.get("thread_ts") == parent_ts
                   and _in_range(ts, params)]
        replies.sort(key=lambda m: float(m["ts"]))
        return _page([parent, *replies], params, default=1000, most=1000)

    def _known_channel(self, params: JSONDict) -> str:
        channel_id = str(params.get("channel") or "")
        if channel_id not in self.channels:
            raise SlackError("channel_not_found")
        return channel_id

    async def _apps_connections_open(self, params: JSONDict) -> JSONDict:
        ticket = secrets.token_hex(8)
        self._tickets.add(ticket)
        return {"url": f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}&app_id={self.app_id}"}

    def _resolve_channel(self, value: Any) -> str:
        """Channel id, "#name", or a user id (opens the IM) -> conversation id."""
        if not value or not isinstance(value, str):
            raise SlackError("channel_not_found")
        if value in self.channels:
            return value
        if value.startswith("#"):
            for channel in self.channels.values():
                if channel.get("name") == value[1:]:
                    return str(channel["id"])
            raise SlackError("channel_not_found")
        if value[0] in "UW" and value in self.users:
            return self.im_channel_for(value)
        if self.strict_channels:
            raise SlackError("channel_not_found")
        return str(self.add_channel(value)["id"])

    def _bot_message(self, params: JSONDict, ts: str) -> JSONDict:
        message: JSONDict = {
            "type": "message",
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "text": params.get("text") or "",
            "ts": ts,
            "team": self.team_id,
            "bot_profile": {
                "id": self.bot_id,
                "app_id": self.app_id,
                "name": self.bot_name,
                "deleted": False,
                "team_id": self.team_id,
            },
        }
        for key in ("blocks", "attachments", "metadata"):
            if params.get(key):
                message[key] = params[key]
        return message

    # ----------------------------------------------------------------- files

    def add_file(self, data: bytes, name: str, mimetype: str, *, user: str = "U0FAKEUSER",
                 size: int | None = None, **fields: Any) -> JSONDict:
        """Host ``data`` and return its file object as events carry it (``size`` overrides
        the announced size, for files past a limit)."""
        file_id = f"F{next(self._file_seq):08d}"
        path = f"{self.team_id}-{file_id}/download/{name}"
        self.hosted[path] = data
        url = f"{self.root_url}/files-pri/{path}"
        obj: JSONDict = {
            "id": file_id, "created": int(time.time()), "timestamp": int(time.time()),
            "name": name, "title": name, "mimetype": mimetype,
            "filetype": name.rsplit(".", 1)[-1] if "." in name else "binary",
            "pretty_type": mimetype, "user": user, "user_team": self.team_id,
            "editable": False, "size": len(data) if size is None else size, "mode": "hosted",
            "is_external": False, "external_type": "", "is_public": False,
            "public_url_shared": False, "display_as_bot": False, "username": "",
            "url_private": url.replace("/download/", "/"), "url_private_download": url,
            "permalink": f"{self.root_url}/files/{user}/{file_id}/{name}",
        }
        obj.update(fields)
        return obj

    def file_event(self, channel: str, user: str, files: list[JSONDict], text: str = "", *,
                   ts: str | None = None, thread_ts: str | None = None) -> JSONDict:
        """A ``message`` event with ``files`` (subtype ``file_share``), as Slack sends for an
        upload; in a DM when ``channel`` is the user's IM id."""
        envelope = self.message_event(channel, text, user=user, ts=ts, thread_ts=thread_ts,
                                      subtype="file_share")
        event = envelope["event"]
        event["files"] = files
        event["upload"] = True
        event["display_as_bot"] = False
        if user and "client_msg_id" not in event:
            event["client_msg_id"] = str(uuid.uuid4())
        self.messages[(channel, event["ts"])] = dict(event)
        return envelope

    async def _handle_file_download(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["tail"]
        auth = request.headers.get("Authorization")
        self.file_downloads.append((path, auth))
        if auth != f"Bearer {self.bot_token}":
            # Slack sends a browser without a valid token to its sign-in page.
            raise web.HTTPFound(f"{self.root_url}/signin?redir=/files-pri/{path}")
        if path in self.moved:
            raise web.HTTPFound(f"{self.root_url}/files-pri/{self.moved[path]}")
        try:
            await self.downloads.passage("file")
        except Dropped:
            return web.Response(status=502, text="dropped")
        data = self.hosted.get(path)
        if data is None:
            raise web.HTTPNotFound()
        self.files_served.append(path)
        return web.Response(body=data, content_type="application/octet-stream")

    async def _handle_upload(self, request: web.Request) -> web.StreamResponse:
        upload = self.uploads.get(request.match_info["file_id"])
        if upload is None:
            return web.Response(status=404, text="unknown upload")
        upload["data"] = await request.read()
        return web.Response(text=f"OK - {len(upload['data'])}")

    async def _files_get_upload_url(self, params: JSONDict) -> JSONDict:
        filename, length = params.get("filename"), params.get("length")
        if not filename or length is None:
            raise SlackError("invalid_arguments")
        file_id = f"F{next(self._file_seq):08d}"
        self.uploads[file_id] = {"filename": filename, "length": int(length), "data": None}
        return {"upload_url": f"{self.root_url}/upload/v1/{file_id}", "file_id": file_id}

    async def _files_complete_upload(self, params: JSONDict) -> JSONDict:
        files = params.get("files")
        if not isinstance(files, list) or not files:
            raise SlackError("invalid_arguments")
        done = []
        for item in files:
            upload = self.uploads.get(str(item.get("id"))) if isinstance(item, dict) else None
            if upload is None or upload["data"] is None:
                raise SlackError("file_not_found")
            if len(upload["data"]) != upload["length"]:
                raise SlackError("file_upload_size_mismatch")
            shared = {"id": item["id"], "title": item.get("title"), **upload,
                      "channel": params.get("channel_id"), "thread_ts": params.get("thread_ts")}
            self.shared_files.append(shared)
            done.append({"id": item["id"], "title": item.get("title") or upload["filename"],
                         "name": upload["filename"], "size": upload["length"]})
        return {"files": done}

    # ----------------------------------------------------------------- event builders

    def envelope(self, event: JSONDict, *, event_id: str | None = None) -> JSONDict:
        """Wrap an inner event into the ``event_callback`` envelope Slack POSTs."""
        event_time = int(float(event.get("event_ts") or event.get("ts") or time.time()))
        return {
            "token": self.verification_token,
            "team_id": self.team_id,
            "context_team_id": self.team_id,
            "context_enterprise_id": None,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{next(self._event_seq):04d}{secrets.token_hex(4).upper()}",
            "event_time": event_time,
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": self.team_id,
                    "user_id": self.bot_user_id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": "4-" + secrets.token_urlsafe(24),
        }

    def message_event(
        self,
        channel: str,
        text: str,
        *,
        user: str | None = None,
        ts: str | None = None,
        thread_ts: str | None = None,
        bot_id: str | None = None,
        subtype: str | None = None,
        channel_type: str | None = None,
    ) -> JSONDict:
        """A ``message`` event envelope (also for bot echoes: pass ``bot_id``)."""
        ts = ts or self.next_ts()
        if channel_type is None:
            channel_type = _channel_type(self.channels.get(channel), channel)
        event: JSONDict = {"type": "message"}
        if subtype:
            event["subtype"] = subtype
        if user:
            self.add_user(user)
            event["user"] = user
        if bot_id:
            event["bot_id"] = bot_id
        event.update(
            text=text,
            ts=ts,
            team=self.team_id,
            channel=channel,
            event_ts=ts,
            channel_type=channel_type,
        )
        if user and not bot_id:
            event["client_msg_id"] = str(uuid.uuid4())
            event["blocks"] = _rich_text_blocks(text)
        self._thread_fields(event, channel, thread_ts)
        self.messages.setdefault((channel, ts), dict(event))
        return self.envelope(event)

    def dm_event(
        self, user: str, text: str, channel: str | None = None, ts: str | None = None
    ) -> JSONDict:
        """The envelope for a human's direct message to the bot (``channel_type: im``)."""
        self.add_user(user)
        if channel is None:
            channel = self.im_channel_for(user)
        else:
            self.add_channel(channel, im_user=user)
        return self.message_event(channel, text, user=user, ts=ts, channel_type="im")

    def mention_events(
        self,
        user: str,
        text: str,
        channel: str = "C0FAKEGEN",
        ts: str | None = None,
        thread_ts: str | None = None,
    ) -> list[JSONDict]:
        """The two envelopes Slack sends for one channel mention: app_mention, message.

        Both share channel/ts, with different event_ids. ``<@BOT>`` is prepended to the
        text if missing, since Slack only emits app_mention when the text mentions the bot.
        """
        mention = f"<@{self.bot_user_id}>"
        if mention not in text:
            text = f"{mention} {text}"
        self.add_channel(channel, name="general" if channel == "C0FAKEGEN" else None)
        message = self.message_event(channel, text, user=user, ts=ts, thread_ts=thread_ts)
        inner = message["event"]
        app_mention: JSONDict = {
            "type": "app_mention",
            "user": user,
            "text": text,
            "ts": inner["ts"],
            "client_msg_id": inner["client_msg_id"],
            "team": self.team_id,
            "blocks": inner["blocks"],
            "channel": channel,
            "event_ts": inner["ts"],
        }
        self._thread_fields(app_mention, channel, thread_ts)
        return [self.envelope(app_mention), message]

    def _thread_fields(self, event: JSONDict, channel: str, thread_ts: str | None) -> None:
        if thread_ts:
            event["thread_ts"] = thread_ts
            parent = self.messages.get((channel, thread_ts))
            if parent is not None and parent.get("user"):
                event["parent_user_id"] = parent["user"]

    # ----------------------------------------------------------------- Events API delivery

    def sign(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        """Slack's request-signing headers for ``body`` (v0 HMAC-SHA256)."""
        ts = int(time.time()) if timestamp is None else timestamp
        base = b"v0:" + str(ts).encode() + b":" + body
        digest = hmac.new(self.signing_secret.encode(), base, hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": f"v0={digest}"}

    async def deliver_event(
        self,
        url: str,
        event_payload: JSONDict,
        *,
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
        signature: str | None = None,
        timestamp: int | None = None,
        timeout: float = 10.0,  # noqa: ASYNC109 - bounds the HTTP request
    ) -> tuple[int, str]:
        """POST an Events API request to the app like Slack does; returns (status, body).

        ``event_payload`` is an envelope (from the builders) or a bare inner event (wrapped
        with a new event_id). ``retry_num`` adds X-Slack-Retry-Num/-Reason; ``signature`` /
        ``timestamp`` override the signing for negative tests.
        """
        if event_payload.get("type") != "event_callback":
            event_payload = self.envelope(event_payload)
        headers: dict[str, str] = {}
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = retry_reason
        return await self._post_signed(
            url,
            orjson.dumps(event_payload),
            "application/json",
            headers,
            signature=signature,
            timestamp=timestamp,
            timeout=timeout,
        )

    async def deliver_url_verification(self, url: str) -> tuple[int, str]:
        """Slack's endpoint handshake; a correct app echoes the challenge."""
        body = {
            "token": self.verification_token,
            "challenge": secrets.token_urlsafe(24),
            "type": "url_verification",
        }
        return await self._post_signed(url, orjson.dumps(body), "application/json", {})

    async def deliver_interactive(self, url: str, payload: JSONDict) -> tuple[int, str]:
        """POST an interactivity payload (block_actions etc.) as ``payload=<json>`` form."""
        body = urlencode({"payload": orjson.dumps(payload).decode()}).encode()
        return await self._post_signed(url, body, "application/x-www-form-urlencoded", {})

    async def _post_signed(
        self,
        url: str,
        body: bytes,
        content_type: str,
        extra_headers: dict[str, str],
        *,
        signature: str | None = None,
        timestamp: int | None = None,
        timeout: float = 10.0,  # noqa: ASYNC109 - bounds the HTTP request
    ) -> tuple[int, str]:
        headers = {
            "Content-Type": content_type,
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            **self.sign(body, timestamp),
            **extra_headers,
        }
        if signature is not None:
            headers["X-Slack-Signature"] = signature
        if self._session is None:
            raise RuntimeError("FakeSlackServer is not started (use 'async with')")
        async with self._session.post(
            url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            text = await response.text()
            self.deliveries.append(
                EventDelivery(url, body, headers, response.status, text, time.time())
            )
            self.last_headers = dict(response.headers)
            return response.status, text

    # ----------------------------------------------------------------- Socket Mode

    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.Response(status=401, text="invalid or used ticket")
        self._tickets.discard(ticket)  # URLs from apps.connections.open are single-use
        ws = web.WebSocketResponse(autoping=True, timeout=1.0)
        await ws.prepare(request)
        self._sockets.append(ws)
        self.socket_connections += 1
        try:
            await ws.send_str(
                orjson.dumps(
                    {
                        "type": "hello",
                        "num_connections": len(self._sockets),
                        "debug_info": {
                            "host": "applink-fake",
                            "build_number": 1,
                            "approximate_connection_time": 18060,
                        },
                        "connection_info": {"app_id": self.app_id},
                    }
                ).decode()
            )
            self.socket_connected.set()
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    self._on_socket_message(msg.data)
        finally:
            self._sockets.remove(ws)
            if not self._sockets:
                self.socket_connected.clear()
        return ws

    def _on_socket_message(self, raw: str) -> None:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        if not isinstance(data, dict):
            return
        self.socket_received.append(data)
        if "envelope_id" in data:
            self.socket_acks.append(data)
            self._acks_pulse.fire()

    async def socket_send(
        self,
        envelope_type: str,
        payload: JSONDict,
        *,
        accepts_response_payload: bool = False,
        retry_attempt: int = 0,
        retry_reason: str = "",
    ) -> str:
        """Send one Socket Mode envelope to the newest connection; returns envelope_id."""
        if not self._sockets:
            raise RuntimeError("no Socket Mode client connected")
        envelope_id = str(uuid.uuid4())
        envelope = {
            "envelope_id": envelope_id,
            "payload": payload,
            "type": envelope_type,
            "accepts_response_payload": accepts_response_payload,
            "retry_attempt": retry_attempt,
            "retry_reason": retry_reason,
        }
        self.socket_sent.append(envelope)
        await self._sockets[-1].send_str(orjson.dumps(envelope).decode())
        return envelope_id

    async def socket_send_event(
        self, payload: JSONDict, *, retry_attempt: int = 0, retry_reason: str = ""
    ) -> str:
        """Push an Events API envelope (or bare event, wrapped) over Socket Mode."""
        if payload.get("type") != "event_callback":
            payload = self.envelope(payload)
        return await self.socket_send(
            "events_api", payload, retry_attempt=retry_attempt, retry_reason=retry_reason
        )

    async def socket_disconnect(self, reason: str = "refresh_requested") -> None:
        """Ask connected clients to reconnect, as Slack does periodically."""
        message = {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}
        for ws in list(self._sockets):
            await ws.send_str(orjson.dumps(message).decode())

    async def wait_for_ack(
        self,
        envelope_id: str,
        timeout: float = WAIT,  # noqa: ASYNC109 - a plain float is the friendlier test API
    ) -> JSONDict:
        """Wait for the client's ``{"envelope_id": ...}`` acknowledgement."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            for ack in self.socket_acks:
                if ack.get("envelope_id") == envelope_id:
                    return ack
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"envelope {envelope_id} not acknowledged within {timeout}s")
            await self._acks_pulse.wait(remaining)


# --------------------------------------------------------------------------------------
# Module helpers
# --------------------------------------------------------------------------------------


def _flag(value: Any) -> bool:
    """A boolean argument as Slack reads it (slack_sdk sends ``1``/``0`` in a query)."""
    return str(value).lower() in ("1", "true")


def _in_range(ts: str, params: JSONDict) -> bool:
    inclusive = _flag(params.get("inclusive"))
    value = float(ts)
    oldest = params.get("oldest")
    latest = params.get("latest")
    if oldest not in (None, "") and (value < float(oldest) or
                                     (value == float(oldest) and not inclusive)):
        return False
    return latest in (None, "") or value < float(latest) or (
        value == float(latest) and inclusive)


def _page(messages: list[JSONDict], params: JSONDict, *, default: int, most: int) -> JSONDict:
    """One page of ``messages`` from the cursor (an offset here; opaque to clients), with
    ``has_more`` and ``response_metadata.next_cursor``; metadata stripped unless asked for."""
    try:
        limit = min(int(params.get("limit") or default), most)
    except ValueError:
        raise SlackError("invalid_limit") from None
    cursor = str(params.get("cursor") or "")
    start = int(cursor.removeprefix("off:")) if cursor.startswith("off:") else 0
    page = messages[start:start + max(limit, 1)]
    more = start + len(page) < len(messages)
    keep = _flag(params.get("include_all_metadata"))
    shown = [m if keep else {k: v for k, v in m.items() if k != "metadata"} for m in page]
    return {"messages": [dict(m) for m in shown], "has_more": more,
            "response_metadata": {"next_cursor": f"off:{start + len(page)}" if more else ""}}


def _bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return None


async def _read_params(request: web.Request) -> JSONDict:
    """Merge query string and body (JSON, urlencoded or multipart) into one dict."""
    params: JSONDict = dict(request.query)
    if request.can_read_body:
        if request.content_type == "application/json":
            body = await request.read()
            data = orjson.loads(body) if body else {}
            if isinstance(data, dict):
                params.update(data)
        else:
            form = await request.post()
            for key, value in form.items():
                if isinstance(value, web.FileField):
                    params[key] = {
                        "filename": value.filename,
                        "content_type": value.content_type,
                        "data": value.file.read(),
                    }
                else:
                    params[key] = value
    for key in _JSON_FIELDS:
        encoded = params.get(key)
        if isinstance(encoded, str):
            # Undecodable JSON stays a string; _validate_content reports invalid_blocks.
            with contextlib.suppress(orjson.JSONDecodeError):
                params[key] = orjson.loads(encoded)
    return params


def _validate_content(params: JSONDict) -> None:
    """The message-content checks chat.postMessage / chat.update make."""
    text = params.get("text")
    blocks = params.get("blocks")
    if not text and not blocks and not params.get("attachments"):
        raise SlackError("no_text")
    if isinstance(text, str) and len(text) > MAX_TEXT_CHARS:
        raise SlackError("msg_too_long")
    if blocks is None or blocks == []:
        return
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
        raise SlackError("invalid_blocks")
    for block in blocks:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise SlackError("invalid_blocks")
        section_text = block.get("text")
        if isinstance(section_text, dict) and len(str(section_text.get("text", ""))) > (
            MAX_SECTION_TEXT
        ):
            raise SlackError("invalid_blocks")


def _channel_type(channel: JSONDict | None, channel_id: str) -> str:
    if channel is not None:
        if channel.get("is_im"):
            return "im"
        if channel.get("is_mpim"):
            return "mpim"
        if channel.get("is_private"):
            return "group"
        return "channel"
    return {"D": "im", "G": "group"}.get(channel_id[:1], "channel")


def _rich_text_blocks(text: str) -> list[JSONDict]:
    """The rich_text block Slack clients attach to typed messages (mentions as user elements)."""
    elements: list[JSONDict] = []
    position = 0
    for match in _MENTION_TOKEN_RE.finditer(text):
        if match.start() > position:
            elements.append({"type": "text", "text": text[position : match.start()]})
        elements.append({"type": "user", "user_id": match.group(1)})
        position = match.end()
    if position < len(text):
        elements.append({"type": "text", "text": text[position:]})
    return [
        {
            "type": "rich_text",
            "block_id": secrets.token_hex(3),
            "elements": [{"type": "rich_text_section", "elements": elements}],
        }
    ]


__all__ = [
    "EventDelivery",
    "FakeSlackServer",
    "SlackCall",
    "SlackError",
]
