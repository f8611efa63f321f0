"""The web channel over a real gateway on 127.0.0.1, driven by aiohttp's client."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from app.compose import build_gateway
from app.compose_channels import web_channel
from app.config import Settings
from app.server import Gateway
from channels.web.channel import WebChannel
from gateway.delivery.history import StoreHistory
from gateway.edge.channel import Accepted, Answer, Deliver, ReplySink
from gateway.edge.errors import ConfigError, ProviderUnavailable
from gateway.edge.messages import Inbound
from gateway.edge.provider import Provider, ProviderRequest, ProviderResponse, TextSink
from providers.offline import OfflineProvider
from sessions.jsonl import JsonlSessionStore
from tests.waiting import WAIT, until
from tests.web_ids import WEB_TENANT

TOKEN = "t0ken-for-the-tests"
Events = list[tuple[str, dict[str, Any]]]


def settings(data_dir: Path, **extra: Any) -> Settings:
    """Settings for tests: no .env, loopback, port 0, web only (keys are variable names)."""
    values: dict[str, Any] = {
        "GATEWAY_DATA_DIR": data_dir, "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": 0,
        "GATEWAY_CHANNELS": "web", "GATEWAY_PROVIDER": "offline", "GATEWAY_WEB_TOKEN": None,
        "GATEWAY_SHUTDOWN_GRACE": 0.2, "GATEWAY_MAX_MESSAGE_CHARS": 1000,
    }
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]  # pydantic-settings init


class FailingProvider(OfflineProvider):
    """Every call fails as an unreachable provider would."""

    async def complete(
        self, request: ProviderRequest, on_text: TextSink | None = None
    ) -> ProviderResponse:
        raise ProviderUnavailable("connection refused")


class HangingProvider(OfflineProvider):
    """Never answers (until cancelled); ``called`` is set once a call is waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.called = asyncio.Event()

    async def complete(
        self, request: ProviderRequest, on_text: TextSink | None = None
    ) -> ProviderResponse:
        self.called.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Server:
    """A started gateway plus a client session pointed at it."""

    def __init__(self, gateway: Gateway, client: aiohttp.ClientSession) -> None:
        self.gateway = gateway
        self.client = client
        self.base = f"http://127.0.0.1:{gateway.bound_port}"

    @property
    def store(self) -> JsonlSessionStore:
        assert isinstance(self.gateway.store, JsonlSessionStore)
        return self.gateway.store

    async def post(self, body: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        # A stream, not bytes: aiohttp warns about large raw-bytes bodies.
        data = io.BytesIO(body if isinstance(body, bytes) else orjson.dumps(body))
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        async with self.client.post(self.base + "/api/chat", data=data, headers=headers,
                                    **kwargs) as resp:
            return resp.status, await resp.json()

    async def get(self, path: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        async with self.client.get(self.base + path, **kwargs) as resp:
            return resp.status, await resp.json()

    async def stream(self, body: dict[str, Any]) -> Events:
        async with self.client.post(self.base + "/api/chat",
                                    json={**body, "stream": True}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            return await sse_events(resp)

    def entry_types(self, session: str) -> list[str]:
        data = self.store.path_of(WEB_TENANT, session).read_bytes()
        return [orjson.loads(line)["type"] for line in data.splitlines()]

    def session_files(self) -> list[Path]:
        """Session logs, and owed-journal lines (the journal file itself exists once the
        gateway runs): what a refused request must not leave behind."""
        journal = self.store.data_dir / "state" / "delivery.jsonl"
        owed = [journal] if journal.exists() and journal.read_bytes() else []
        return sorted(self.store.data_dir.rglob("sessions/*.jsonl")) + owed


async def sse_events(response: aiohttp.ClientResponse) -> Events:
    """The (event, data) pairs of a Server-Sent Events answer, read to its end."""
    events: Events = []
    name = ""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, orjson.loads(line.removeprefix("data: "))))
    return events


@asynccontextmanager
async def bare_channel(channel: WebChannel, deliver: Deliver) -> AsyncIterator[str]:
    """``channel`` alone on an aiohttp server on 127.0.0.1, delivering into ``deliver`` (a
    stand-in for the router): its ``/api/chat`` URL."""
    app = web.Application()
    app.add_routes(channel.routes())
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        await channel.start(deliver)
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/api/chat"
    finally:
        await runner.cleanup()


Start = Callable[..., Awaitable[Server]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    """Starts gateways on demand; closes them (and their clients) at the end of the test."""
    async with web_gateways(tmp_path) as starter:
        yield starter


@asynccontextmanager
async def web_gateways(tmp_path: Path) -> AsyncIterator[Start]:
    """What the ``start`` fixture gives (other test modules build their fixture on it)."""
    opened: list[Server] = []

    async def _start(provider: Provider | None = None, channel: WebChannel | None = None,
                     **extra: Any) -> Server:
        chosen = [channel] if channel is not None else None
        gateway = build_gateway(settings(tmp_path, **extra),
                                provider=provider or OfflineProvider(), channels=chosen)
        await gateway.start()
        server = Server(gateway, aiohttp.ClientSession())
        opened.append(server)
        return server

    yield _start
    for server in opened:
        await server.client.close()
        await server.gateway.aclose()


@pytest.fixture
async def server(start: Start) -> Server:
    return await start()


async def test_chat_answers_with_session_and_reply(server: Server) -> None:
    """POST /api/chat waits for the turn and answers the session id and the reply."""
    status, body = await server.post({"conversation": "c1", "text": "hello"})
    assert status == 200
    assert set(body) == {"session", "reply"}
    assert 'You said: "hello"' in body["reply"]
    assert server.store.path_of(WEB_TENANT, body["session"]).is_file()


async def test_stream_deltas_add_up_to_the_reply(server: Server) -> None:
    """SSE: session first, then deltas whose concatenation is the final reply, then done."""
    events = await server.stream({"conversation": "c1", "text": "tell me something long"})
    names = [name for name, _ in events]
    assert names[0] == "session"
    assert names[-1] == "done"
    assert set(names[1:-1]) == {"delta"}
    assert len(names) > 3  # the offline provider streams a few words at a time
    done = events[-1][1]
    assert done["session"] == events[0][1]["session"]
    assert "".join(data["text"] for name, data in events if name == "delta") == done["reply"]


async def test_accept_header_also_selects_streaming(server: Server) -> None:
    """Accept: text/event-stream streams even without "stream": true in the body."""
    async with server.client.post(server.base + "/api/chat",
                                  json={"conversation": "c1", "text": "hi"},
                                  headers={"Accept": "text/event-stream"}) as resp:
        text = await resp.text()
    assert resp.status == 200
    assert text.startswith("event: session\ndata: {")
    assert "event: done\n" in text


async def test_history_holds_only_message_entries(server: Server) -> None:
    """History lists user and assistant messages in order; the log also has the call entries."""
    _, first = await server.post({"conversation": "h1", "text": "first"})
    _, second = await server.post({"conversation": "h1", "text": "second"})
    assert first["session"] == second["session"]
    status, body = await server.get("/api/history?conversation=h1")
    assert status == 200
    assert body["session"] == first["session"]
    assert body["total"] == 4
    assert [(m["role"], m["text"]) for m in body["messages"]] == [
        ("user", "first"), ("assistant", first["reply"]),
        ("user", "second"), ("assistant", second["reply"]),
    ]
    types = set(server.entry_types(body["session"]))
    assert {"session", "prompt", "section", "call", "outcome", "message"} <= types
    _, page = await server.get("/api/history?conversation=h1&offset=1&limit=2")
    assert (page["total"], page["offset"]) == (4, 1)
    assert [m["text"] for m in page["messages"]] == [first["reply"], "second"]


async def test_history_of_an_unknown_conversation_is_empty(server: Server) -> None:
    """A conversation that never spoke has no session and no messages."""
    status, body = await server.get("/api/history?conversation=nobody")
    assert (status, body) == (200, {"session": None, "total": 0, "offset": 0, "messages": []})


async def test_two_conversations_run_concurrently(start: Start) -> None:
    """Two conversations at once get their own sessions and their own answers."""
    server = await start(provider=OfflineProvider(delay=0.01))
    (sa, a), (sb, b) = await asyncio.gather(
        server.post({"conversation": "alice", "text": "I am Alice"}),
        server.post({"conversation": "bob", "text": "I am Bob"}),
    )
    assert (sa, sb) == (200, 200)
    assert a["session"] != b["session"]
    assert "Alice" in a["reply"]
    assert "Bob" not in a["reply"]
    assert "Bob" in b["reply"]
    assert "Alice" not in b["reply"]


async def test_control_characters_are_stripped(server: Server) -> None:
    """Control characters other than newline and tab never reach the session."""
    status, _ = await server.post({"conversation": "c1", "text": "he\x00llo\x1b[0m\r\n\tok\x7f"})
    assert status == 200
    _, body = await server.get("/api/history?conversation=c1")
    assert body["messages"][0]["text"] == "hello[0m\n\tok"


BAD_BODIES = [
    pytest.param(b"{not json", 400, id="malformed-json"),
    pytest.param(b"[1, 2]", 400, id="array-body"),
    pytest.param(b'"text"', 400, id="string-body"),
    pytest.param(b'{"conversation": "c1"}', 400, id="missing-text"),
    pytest.param(b'{"text": "hi"}', 400, id="missing-conversation"),
    pytest.param(b'{"conversation": "c1", "text": 5}', 400, id="text-not-string"),
    pytest.param(b'{"conversation": "../x", "text": "hi"}', 400, id="conversation-traversal"),
    pytest.param(b'{"conversation": "", "text": "hi"}', 400, id="conversation-empty"),
    pytest.param(b'{"conversation": "c1", "text": "  \\u0000 "}', 400, id="text-empty"),
    pytest.param(b'{"conversation": "c1", "text": "hi", "stream": "yes"}', 400, id="bad-stream"),
    pytest.param(b'{"conversation": "c1", "text": "hi", "id": 7}', 400, id="bad-id"),
    pytest.param(b'{"conversation": "c1", "text": "hi", "name": []}', 400, id="bad-name"),
    pytest.param(b'{"conversation": "c1", "text": "\xff\xfe"}', 400, id="invalid-utf8"),
    pytest.param(b'{"conversation": "c1", "text": "' + b"x" * 1001 + b'"}', 413, id="too-long"),
    # Over the body limit: one attachment at GATEWAY_MAX_ATTACHMENT_BYTES in base64, plus 1 MiB.
    pytest.param(b"{" + b" " * (20 * 1024 * 1024 * 4 // 3 + 1024 * 1024 + 1) + b"}", 413,
                 id="over-limit-body"),
]


@pytest.mark.parametrize(("body", "expected"), BAD_BODIES)
async def test_bad_input_is_refused_and_never_recorded(
    server: Server, body: bytes, expected: int
) -> None:
    """Bad input gets a JSON error with a 4xx status, and no session file is written."""
    status, answer = await server.post(body)
    assert status == expected
    assert isinstance(answer["error"], str)
    assert answer["error"]
    assert server.session_files() == []


async def test_too_long_names_the_limit(server: Server) -> None:
    """The 413 for a long message says how long it was and what the limit is."""
    status, answer = await server.post({"conversation": "c1", "text": "y" * 1500})
    assert status == 413
    assert "1500" in answer["error"]
    assert "1000" in answer["error"]


@pytest.mark.parametrize("query", [
    "", "?conversation=..%2Fx", "?conversation=c1&offset=-1", "?conversation=c1&limit=abc",
])
async def test_bad_history_queries_are_400(server: Server, query: str) -> None:
    """History refuses a missing or unsafe conversation id and non-numeric paging."""
    status, answer = await server.get("/api/history" + query)
    assert status == 400
    assert answer["error"]


async def test_retried_message_id_gets_the_recorded_answer_and_is_recorded_once(
        server: Server) -> None:
    """A retried client message id gets the answer the first delivery got (never a 409
    with nothing), and the session holds the message once."""
    body = {"conversation": "c1", "text": "once", "id": "m-1"}
    first = await server.post(body)
    again = await server.post(body)
    streamed = await server.stream({**body, "stream": True})
    assert first[0] == 200
    assert again == first
    assert streamed == [("session", {"session": first[1]["session"]}),
                        ("done", {"session": first[1]["session"], "reply": first[1]["reply"]})]
    _, history = await server.get("/api/history?conversation=c1")
    assert [m["text"] for m in history["messages"]].count("once") == 1


async def test_message_ids_are_scoped_to_their_conversation(server: Server) -> None:
    """The same client id in two conversations is two messages, each answered."""
    a = await server.post({"conversation": "a", "text": "in a", "id": "m-1"})
    b = await server.post({"conversation": "b", "text": "in b", "id": "m-1"})
    assert (a[0], b[0]) == (200, 200)
    assert a[1]["session"] != b[1]["session"]
    for conversation, text in (("a", "in a"), ("b", "in b")):
        _, history = await server.get(f"/api/history?conversation={conversation}")
        assert [m["text"] for m in history["messages"] if m["role"] == "user"] == [text]


async def test_provider_failure_is_502_and_an_error_event(start: Start) -> None:
    """A turn that apologises answers 502 (JSON) or an error event (SSE)."""
    server = await start(provider=FailingProvider())
    status, body = await server.post({"conversation": "c1", "text": "hi"})
    assert status == 502
    assert body["session"]
    assert "Sorry" in body["error"]
    events = await server.stream({"conversation": "c1", "text": "again"})
    assert [name for name, _ in events] == ["session", "error"]
    assert events[1][1]["status"] == 502


async def test_reply_wait_is_bounded(start: Start, tmp_path: Path) -> None:
    """No reply within the bound: 504 for JSON, an error event with status 504 for SSE."""
    channel = WebChannel(history=StoreHistory(JsonlSessionStore(tmp_path)), reply_timeout=0.2)
    server = await start(provider=HangingProvider(), channel=channel)
    status, body = await server.post({"conversation": "c1", "text": "hi"})
    assert status == 504
    assert body["session"]
    assert body["error"]
    events = await server.stream({"conversation": "c2", "text": "hi"})
    assert [name for name, _ in events] == ["session", "error"]
    assert events[1][1]["status"] == 504


async def test_shutdown_ends_waiting_requests_with_503(start: Start, tmp_path: Path) -> None:
    """Closing the gateway answers a request still waiting with 503 after the grace."""
    channel = WebChannel(history=StoreHistory(JsonlSessionStore(tmp_path)), reply_timeout=60,
                         shutdown_grace=0.1)
    provider = HangingProvider()
    server = await start(provider=provider, channel=channel)
    waiting = asyncio.create_task(server.post({"conversation": "c1", "text": "hi"}))
    await asyncio.wait_for(provider.called.wait(), WAIT)
    await server.gateway.aclose()
    status, body = await asyncio.wait_for(waiting, 10)
    assert status == 503
    assert "shut down" in body["error"]


async def test_a_message_from_an_earlier_run_never_answers_into_a_live_request(
        tmp_path: Path) -> None:
    """A message owed from the last run carries that run's request id: in this run it gets a
    sink nobody listens to, never the live request that happens to hold the same number."""
    held: list[Inbound] = []
    release = asyncio.Event()

    async def deliver(inbound: Inbound, sink: ReplySink | None = None) -> Accepted:
        held.append(inbound)
        await release.wait()
        return Accepted(session_id="s1")

    runs = [WebChannel(history=StoreHistory(JsonlSessionStore(tmp_path)), reply_timeout=1)
            for _ in range(2)]
    runners: list[web.AppRunner] = []
    posts: list[asyncio.Task[int]] = []
    try:
        async with aiohttp.ClientSession() as client:
            for run in runs:
                app = web.Application()
                app.add_routes(run.routes())
                runner = web.AppRunner(app)
                runners.append(runner)
                await runner.setup()
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                await run.start(deliver)
                url = f"http://127.0.0.1:{runner.addresses[0][1]}/api/chat"
                posts.append(asyncio.create_task(_status(client, url, len(posts))))
                await until(lambda: len(held) >= len(posts))
            earlier, live = held
            sink = runs[1].reply_sink(live)
            assert runs[1].reply_sink(earlier) is not sink
            await sink.finish("the live one")
            release.set()
            assert await asyncio.wait_for(asyncio.gather(*posts), WAIT) == [504, 200]
    finally:
        release.set()
        for runner in runners:
            await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_relayed_reply_that_is_lost_is_found_in_the_log(
        tmp_path: Path, stream: bool) -> None:
    """Several workers: the reply to a request comes from the worker serving it, through
    Redis. When neither its record's notice nor the reply ever comes (Redis lost them), the
    request gets the answer recorded in the log, with its session, not a 504 a minute later."""
    looked: list[float] = []

    async def answered(within: float) -> Answer | None:
        looked.append(within)
        return Answer("s9", True, "from the log") if len(looked) >= 2 else None

    async def deliver(inbound: Inbound, sink: ReplySink | None = None) -> Accepted:
        never = asyncio.get_running_loop().create_future()  # the lost notice
        return Accepted(session_id=None, recorded=never, answered=answered)

    channel = WebChannel(history=StoreHistory(JsonlSessionStore(tmp_path)), reply_timeout=30,
                         lost_reply_check=0.05)
    body = {"conversation": "c", "text": "hi", "stream": stream}
    async with bare_channel(channel, deliver) as url, aiohttp.ClientSession() as client, \
            asyncio.timeout(20), client.post(url, json=body) as response:
        assert response.status == 200
        if stream:
            assert await sse_events(response) == [
                ("session", {"session": "s9"}),
                ("done", {"session": "s9", "reply": "from the log"})]
        else:
            assert await response.json() == {"session": "s9", "reply": "from the log"}
    assert looked == [0, 0]  # looked up now and then, never waiting on the store


@pytest.mark.parametrize("stream", [False, True])
async def test_a_relayed_reply_is_sent_as_soon_as_it_comes(
        tmp_path: Path, stream: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's notice and the reply relayed from another worker are sent the moment they
    come, while the log is still being looked at now and then."""
    monkeypatch.setattr("channels.web.sse.KEEPALIVE_SECONDS", 3600.0)  # nothing waits it out

    async def answered(within: float) -> Answer | None:
        return None  # not in the log yet: the relay is faster

    async def deliver(inbound: Inbound, sink: ReplySink | None = None) -> Accepted:
        assert sink is not None
        recorded = asyncio.get_running_loop().create_future()

        async def serve() -> None:  # the serving worker, elsewhere
            for _ in range(20):  # later than the request's own steps on the loop: the channel
                await asyncio.sleep(0)  # is waiting for these by then, with no clock to run out
            recorded.set_result("s7")
            await sink.finish("relayed")

        tasks.append(asyncio.create_task(serve()))
        return Accepted(session_id=None, recorded=recorded, answered=answered)

    tasks: list[asyncio.Task[None]] = []
    channel = WebChannel(history=StoreHistory(JsonlSessionStore(tmp_path)), reply_timeout=3600,
                         lost_reply_check=3600)
    body = {"conversation": "c", "text": "hi", "stream": stream}
    async with bare_channel(channel, deliver) as url, aiohttp.ClientSession() as client, \
            asyncio.timeout(30), client.post(url, json=body) as response:
        assert response.status == 200
        text = await response.text()
    if stream:
        assert "event: session" in text
        assert "event: done" in text
        assert '"reply":"relayed"' in text
    else:
        assert orjson.loads(text) == {"session": "s7", "reply": "relayed"}


async def _status(client: aiohttp.ClientSession, url: str, n: int) -> int:
    async with client.post(url, json={"conversation": f"c{n}", "text": "hi"}) as response:
        return response.status


async def test_closed_channel_refuses_with_503(server: Server) -> None:
    """After the channel stops taking input, new messages get 503."""
    web_channel = server.gateway.channels[0]
    await web_channel.aclose()
    status, body = await server.post({"conversation": "c1", "text": "hi"})
    assert status == 503
    assert body["error"]


async def test_token_is_required_when_configured(start: Start) -> None:
    """With a token, /api needs the bearer token (401 without or wrong); the page still loads."""
    server = await start(GATEWAY_WEB_TOKEN=TOKEN)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        status, body = await server.get("/api/history?conversation=c1", headers=headers)
        assert status == 401
        assert body["error"]
        status, _ = await server.post({"conversation": "c1", "text": "hi"}, headers=headers)
        assert status == 401
    good = {"Authorization": f"Bearer {TOKEN}"}
    status, _ = await server.get("/api/history?conversation=c1", headers=good)
    assert status == 200
    status, body = await server.post({"conversation": "c1", "text": "hi"}, headers=good)
    assert status == 200
    assert body["reply"]
    async with server.client.get(server.base + "/") as resp:
        assert resp.status == 200


async def test_other_origins_and_hosts_are_refused_without_a_token(server: Server) -> None:
    """Without a token, a foreign Origin (CSRF) or Host (DNS rebinding) gets 403."""
    body = {"conversation": "c1", "text": "hi"}
    status, _ = await server.post(body, headers={"Origin": "http://evil.example"})
    assert status == 403
    status, _ = await server.post(body, headers={"Host": "evil.example"})
    assert status == 403
    own = server.base.removeprefix("http://")
    status, _ = await server.post(body, headers={"Origin": f"http://{own}"})
    assert status == 200
    assert server.session_files() != []


@pytest.mark.parametrize("scheme", ["https", "ws", "file", ""])
async def test_an_origin_of_another_scheme_on_the_same_host_is_refused(
        server: Server, scheme: str) -> None:
    """An ``Origin`` with this server's host and port but another scheme (an https page, a
    ``null``-like origin without one) is another origin: 403, nothing recorded."""
    own = server.base.removeprefix("http://")
    origin = f"{scheme}://{own}" if scheme else own
    status, _ = await server.post({"conversation": "c1", "text": "hi"},
                                  headers={"Origin": origin})
    assert status == 403
    assert server.session_files() == []


async def test_non_loopback_host_needs_a_token(tmp_path: Path) -> None:
    """Bound beyond loopback, the channel refuses to start without a token, starts with one."""
    store = JsonlSessionStore(tmp_path)

    async def deliver(inbound: Inbound) -> None:
        raise AssertionError("not reached")

    channel = web_channel(settings(tmp_path, GATEWAY_HOST="0.0.0.0"), StoreHistory(store))
    with pytest.raises(ConfigError, match="GATEWAY_WEB_TOKEN"):
        await channel.start(deliver)
    guarded = web_channel(
        settings(tmp_path, GATEWAY_HOST="192.0.2.1", GATEWAY_WEB_TOKEN=TOKEN), StoreHistory(store)
    )
    await guarded.start(deliver)
    await guarded.aclose()


async def test_page_and_static_files(server: Server) -> None:
    """The page and its assets are served with a CSP; unknown names are 404."""
    async with server.client.get(server.base + "/") as resp:
        page = await resp.text()
        assert resp.status == 200
        assert resp.content_type == "text/html"
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
    assert '<script src="/static/app.js"' in page
    # The page names its icon (no request for a missing /favicon.ico), served like the rest.
    assert '<link rel="icon" href="/static/favicon.svg"' in page
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css"),
                       ("favicon.svg", "image/svg+xml")):
        async with server.client.get(f"{server.base}/static/{name}") as resp:
            assert (resp.status, resp.content_type) == (200, kind)
    for name in ("nope.js", "index.html", "..%2Fchannel.py"):
        async with server.client.get(f"{server.base}/static/{name}") as resp:
            assert resp.status == 404


async def test_healthz_and_metrics(server: Server) -> None:
    """/healthz reports the web channel's request count; /metrics has the turn counters and
    the process metrics under their standard names (process_*)."""
    await server.post({"conversation": "c1", "text": "hi"})
    status, health = await server.get("/healthz")
    assert status == 200
    assert health["channels"]["web"] == {"ok": True, "requests": 1}
    async with server.client.get(server.base + "/metrics") as resp:
        text = await resp.text()
    assert resp.status == 200
    assert "gateway_turns_total" in text
    assert "gateway_persist_failures_total" in text
    # The process metrics under the standard names stock dashboards look for.
    assert "\nprocess_resident_memory_bytes " in text
    assert "\nprocess_cpu_seconds_total " in text
    assert "gateway_process_" not in text


def test_gateway_run_refuses_non_loopback_without_token(tmp_path: Path) -> None:
    """``gateway run --host 0.0.0.0`` without a token exits 2 with one line naming the token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "run", "--host", "0.0.0.0", "--port", "0",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env={**env, "GATEWAY_PROVIDER": "offline"},
        timeout=60, check=False,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("gateway run: GATEWAY_HOST=0.0.0.0 is not a loopback address")
    assert "GATEWAY_WEB_TOKEN" in run.stderr
