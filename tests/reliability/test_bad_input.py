"""Bad input against a real running gateway: clear 4xx answers, never a 500, nothing written.

One gateway per test, built by ``build_gateway`` with the web, Slack (Events API over HTTP) and
Telegram (webhook) channels, the admin viewer, and the scripted provider, talking to the fake
Slack and Telegram servers. Every HTTP route it serves is found in ``gateway.web_app.router``,
so an endpoint added later is fuzzed here without editing this file. "Nothing written" is
checked by comparing every file (names and bytes) under the test's directory before and after:
the data dir sits three levels down, so a ``../../`` escape would land inside the snapshot.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
import pytest
import yarl

from app.cli import main as cli_main
from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from sessions.errors import InvalidNameError
from sessions.jsonl import JsonlSessionStore
from sessions.names import MAX_NAME_LENGTH
from sessions.replay import replay_bytes
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer
from tests.reliability.support import session_files, tree, wait_until

ADMIN_TOKEN = "adm1n-T0ken-for-the-tests_Qx7vZ9kW"
TG_SECRET = "tg_s3cret-Token"
SLACK_USER = "U1"
TG_USER = 1001
MAX_CHARS = 16_000

# Names that must never become a path: traversal, separators, hidden files, option-like, empty,
# too long, control and non-ASCII characters, encodings of the above.
UNSAFE_NAMES = [
    "..", "../x", "../../outside", "a/../../b", "/etc/passwd", "a/b", "a\\b", ".hidden",
    "-rf", "", " ", "x" * (MAX_NAME_LENGTH + 1), "y" * 10_000, "a\x00b", "a\nb", "ok..",
    "..ok", "%2e%2e", "..%2f..%2fx", "\uff58\uff59", "C:", "nul\x7f", "a b", "a;b", "😀",
]
# 5xx is never acceptable; these are the refusals a client may see (429: the admin sign-in
# after a few wrong tokens from one client).
REFUSALS = {400, 401, 403, 404, 405, 413, 422, 429}
OUR_PACKAGES = ("gateway", "channels", "providers", "coordination", "toolsets", "sessions", "app")
"""Our loggers are named by module (``__name__``), so a record of ours starts with one of these."""


def metric(gateway: Gateway, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (read in-process)."""
    total = 0.0
    for family in gateway.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


@dataclass
class Stack:
    """The running gateway, the fake platforms and an HTTP client."""

    gateway: Gateway
    slack: FakeSlackServer
    telegram: FakeTelegramServer
    http: aiohttp.ClientSession
    root: Path
    data_dir: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.gateway.bound_port}"

    async def request(self, method: str, path: str, body: bytes | None = None,
                      headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        # A stream, not bytes: aiohttp warns about large raw-bytes bodies.
        data = io.BytesIO(body) if body is not None else None
        # encoded=True: the path goes out as written ("..", "%2F"), not normalised by the client.
        url = yarl.URL(self.base + path, encoded=True)
        async with self.http.request(method, url, data=data,
                                     headers=dict(headers or {}),
                                     allow_redirects=False) as response:
            return response.status, await response.read()

    async def chat(self, body: Any) -> tuple[int, dict[str, Any]]:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        status, answer = await self.request("POST", "/api/chat", raw,
                                            {"Content-Type": "application/json"})
        return status, orjson.loads(answer)

    async def slack_event(self, envelope: dict[str, Any]) -> int:
        """POST a signed Events API envelope, as Slack does."""
        body = orjson.dumps(envelope)
        status, _ = await self.request("POST", "/slack/events", body, {
            "Content-Type": "application/json", **self.slack.sign(body)})
        return status

    def slack_turns(self) -> float:
        return metric(self.gateway, "gateway_turns_total", channel="slack")

    async def slack_marker(self, text: str = "marker") -> dict[str, Any]:
        """A DM from the allowed Slack user, answered in its thread: the positive sign that
        every Slack event before it has been handled (a DM is one conversation, served in
        order), so what did not show by now never will. Returns its envelope."""
        envelope = self.slack.dm_event(SLACK_USER, text)
        assert await self.slack_event(envelope) == 200
        await wait_until(lambda: any(p.thread_ts == envelope["event"]["ts"]
                                     for p in self.slack.posts()), what=f"the answer to {text!r}")
        await wait_until(lambda: self.gateway.router.serving == 0 and self.gateway.router.queued
                         == 0, what="every conversation served")
        return envelope

    def user_texts(self) -> dict[str, list[str]]:
        """Every session's user messages, by conversation."""
        found: dict[str, list[str]] = {}
        for path in session_files(self.data_dir):
            replay = replay_bytes(path.read_bytes())
            found.setdefault(replay.header["conversation"], []).extend(
                m["content"] for m in replay.messages
                if m["role"] == "user" and isinstance(m["content"], str))
        return found


def stack_settings(data_dir: Path, slack: FakeSlackServer,
                   telegram: FakeTelegramServer) -> Settings:
    values: dict[str, Any] = {
        "GATEWAY_DATA_DIR": str(data_dir), "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": 0,
        "GATEWAY_CHANNELS": "web,slack,telegram",
        "GATEWAY_PROVIDER": "offline", "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
        "GATEWAY_WEB_TOKEN": None, "GATEWAY_SHUTDOWN_GRACE": 0.5,
        "GATEWAY_MAX_MESSAGE_CHARS": MAX_CHARS,
        "SLACK_BOT_TOKEN": slack.bot_token, "SLACK_SIGNING_SECRET": slack.signing_secret,
        "SLACK_API_BASE_URL": slack.api_base_url, "SLACK_ALLOWED_USERS": SLACK_USER,
        "TELEGRAM_BOT_TOKEN": telegram.token, "TELEGRAM_API_BASE_URL": telegram.base_url,
        "TELEGRAM_MODE": "webhook", "TELEGRAM_WEBHOOK_SECRET": TG_SECRET,
        "TELEGRAM_RATE_LIMIT": "off", "TELEGRAM_ALLOWED_USERS": str(TG_USER),
    }
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]  # pydantic-settings init


@contextlib.asynccontextmanager
async def running_stack(tmp_path: Path, **overrides: Any) -> AsyncIterator[Stack]:
    """A started gateway (web, Slack, Telegram webhook, admin) over fresh fakes; ``overrides``
    change settings by field name (``http_timeout=0.5``)."""
    data_dir = tmp_path / "a" / "b" / "data"
    async with contextlib.AsyncExitStack() as exits:
        slack = await exits.enter_async_context(FakeSlackServer())
        telegram = await exits.enter_async_context(FakeTelegramServer())
        settings = stack_settings(data_dir, slack, telegram).model_copy(update=overrides)
        gateway = build_gateway(settings, provider=ScriptedProvider())
        await gateway.start()
        exits.push_async_callback(gateway.aclose)
        if settings.store_url is None:
            # The scheduler's first round creates its lock file (beside the sessions, in the
            # data directory) in the background: "nothing written" snapshots are taken after
            # it, or a busy machine would see it appear.
            await wait_until(lambda: (data_dir / "state" / "schedules.lock").exists(),
                             what="the scheduler's first round")
        http = await exits.enter_async_context(aiohttp.ClientSession())
        yield Stack(gateway, slack, telegram, http, tmp_path, data_dir)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    """A started gateway (web, Slack, Telegram webhook, admin) over fresh fakes."""
    async with running_stack(tmp_path) as running:
        yield running


# -- unsafe session ids and tenants ------------------------------------------------------------


async def test_store_refuses_unsafe_names_and_writes_nothing(tmp_path: Path) -> None:
    """Every store call given an unsafe session id or tenant raises InvalidNameError, no I/O."""
    data_dir = tmp_path / "a" / "b" / "data"
    store = JsonlSessionStore(data_dir)
    good = await store.create(channel="web", conversation="web:c", session_id="good")
    await good.aclose()
    before = tree(tmp_path)
    calls: list[tuple[str, Callable[[str], Any]]] = [
        ("create id", lambda n: store.create(channel="web", conversation="c", session_id=n)),
        ("create tenant", lambda n: store.create(tenant=n, channel="web", conversation="c")),
        ("open id", lambda n: store.open("default", n)),
        ("open tenant", lambda n: store.open(n, "good")),
        ("read id", lambda n: store.read_log("default", n)),
        ("read tenant", lambda n: store.read_log(n, "good")),
        ("exists", lambda n: store.exists(n, n)),
        ("page", lambda n: store.message_page("default", n)),
        ("list", lambda n: store.list_sessions(n)),
        ("latest", lambda n: store.latest_session(n, "web:c")),
    ]
    outcomes = []
    for name in UNSAFE_NAMES:
        for what, call in calls:
            try:
                await call(name)
            except InvalidNameError as exc:
                outcomes.append((what, name, "refused" if str(exc) else "no message"))
            else:
                outcomes.append((what, name, "accepted"))
    assert [o for o in outcomes if o[2] != "refused"] == []
    assert tree(tmp_path) == before


def cli(argv: list[str]) -> int:
    """Run the ``gateway`` command in-process; its exit code (argparse exits by SystemExit)."""
    try:
        return cli_main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("name", UNSAFE_NAMES[:12])
def test_replay_cli_refuses_unsafe_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """``gateway replay`` with an unsafe id or tenant exits 1/2 with one line, writes nothing."""
    data_dir = tmp_path / "a" / "b" / "data"
    (data_dir / "sessions").mkdir(parents=True)
    before = tree(tmp_path)
    codes = [
        cli(["replay", "--data-dir", str(data_dir), "--", name]),
        cli(["replay", "good", f"--tenant={name}", "--data-dir", str(data_dir)]),
        cli(["replay", "--list", f"--tenant={name}", "--data-dir", str(data_dir)]),
    ]
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert all(code in (1, 2) for code in codes), codes
    assert len(lines) == 3, err
    assert all(line.startswith("gateway replay: ") for line in lines), err
    assert "Traceback" not in err
    assert tree(tmp_path) == before


async def test_history_and_chat_refuse_unsafe_conversations(stack: Stack) -> None:
    """/api/history and /api/chat answer 400 with a reason for unsafe conversation ids."""
    before = tree(stack.root)
    seen = []
    for name in UNSAFE_NAMES:
        status, body = await stack.request(
            "GET", "/api/history?" + urlencode({"conversation": name}))
        # A request line over 8 KiB is refused by aiohttp's parser itself (a plain-text 400).
        reason = orjson.loads(body)["error"][:15] if len(name) < 4000 else "conversation id"
        seen.append(("history", name, status, reason))
        status, answer = await stack.chat({"conversation": name, "text": "hi"})
        seen.append(("chat", name, status, answer.get("error", "")[:15]))
    assert {(what, status) for what, _, status, _ in seen} == {("history", 400), ("chat", 400)}
    assert all(reason.startswith(('"conversation"', "conversation id")) for *_, reason in seen)
    assert tree(stack.root) == before


async def test_admin_urls_refuse_unsafe_names(stack: Stack) -> None:
    """Admin pages given unsafe ids or tenants answer 400/403/404, never 500, and write nothing."""
    before = tree(stack.root)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    statuses: dict[tuple[str, str], int] = {}
    for name in UNSAFE_NAMES:
        sid, tenant = quote(name, safe=""), urlencode({"tenant": name})
        if not name:  # "?tenant=" means the home tenant, and "/session/" is no session route
            continue
        for path in (f"/admin/session/{sid}", f"/admin/session/{sid}/call/1",
                     f"/admin/session/{sid}/diff?a=1&b=1", f"/admin/session/x?{tenant}",
                     f"/admin/session/x/call/1?{tenant}", f"/admin/?{tenant}",
                     f"/admin/static/{sid}"):
            statuses[(path[:60], name[:20])], _ = await stack.request("GET", path, headers=auth)
    assert {k: s for k, s in statuses.items() if s not in {400, 403, 404}} == {}
    assert tree(stack.root) == before


# -- every endpoint, junk in ---------------------------------------------------------------------

JUNK_BODIES: dict[str, bytes] = {
    "empty": b"",
    "not json": b"{not json",
    "invalid utf-8": b'{"conversation":"c","text":"\xff\xfe\xc3"}',
    "lone surrogate": b'{"conversation":"c","text":"\\ud800"}',
    "array": b"[1,2,3]",
    "scalar": b"42",
    "nested": b"[" * 10_000 + b"]" * 10_000,
    "wrong types": b'{"conversation":1,"text":["x"],"update_id":"1","event":7,"token":null}',
    "form junk": b"payload=%7Bbroken&token=%ff%fe",
    "nul bytes": b"\x00" * 64,
    "oversized": b'{"text":"' + b"x" * (3 * 1024 * 1024) + b'"}',
}
JUNK_QUERIES = [
    "", "?conversation=../../etc&offset=-1&limit=abc", "?tenant=..%2F..&page=99999999999",
    "?a=%00%ff&a=%zz", "?conversation=" + "x" * 4000, "?q=%3Cscript%3E&metric=os%3Asystem",
    "?fragment=1&a=0&b=-1", "?next=//evil.example/x",
]
OTHER_METHODS = ["PUT", "DELETE", "PATCH"]


def concrete(path: str) -> str:
    """A route's canonical path with every ``{placeholder}`` filled with junk."""
    return re.sub(r"\{[^}]*\}", "x%2F..%2Fjunk", path)


def credentials(stack: Stack, path: str, body: bytes) -> dict[str, str]:
    """The right credentials for ``path``, so junk reaches the handler's own parsing."""
    if path.startswith("/admin"):
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    if path.startswith("/slack"):
        return stack.slack.sign(body)
    if path.startswith("/telegram"):
        return {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET}
    return {}


async def test_every_route_answers_junk_without_a_server_error(stack: Stack) -> None:
    """Every route, fed junk bodies, queries and methods, answers 4xx, never 5xx; no writes."""
    # Routes come from the live router, each tried with and without its credentials (admin token,
    # Slack signature, Telegram secret) so the junk also reaches the handlers' own parsing.
    before = tree(stack.root)
    routes = sorted({(r.method, r.resource.canonical) for r in stack.gateway.web_app.router.routes()
                     if r.resource is not None})
    assert ("POST", "/api/chat") in routes
    assert ("POST", "/slack/events") in routes
    results: list[tuple[str, str, str, int]] = []
    for method, canonical in routes:
        path = concrete(canonical)
        if method in ("GET", "HEAD"):
            for query in JUNK_QUERIES:
                for signed in (False, True):
                    headers = credentials(stack, path, b"") if signed else {}
                    status, _ = await stack.request(method, path + query, headers=headers)
                    results.append((method, path, f"query {query[:30]!r} signed={signed}", status))
            continue
        for label, body in JUNK_BODIES.items():
            for signed in (False, True):
                headers = {"Content-Type": "application/json",
                           **(credentials(stack, path, body) if signed else {})}
                status, _ = await stack.request(method, path, body, headers)
                results.append((method, path, f"{label} signed={signed}", status))
    for _, canonical in routes:
        for method in OTHER_METHODS:
            status, _ = await stack.request(method, concrete(canonical), b"{}")
            results.append((method, concrete(canonical), "wrong method", status))
    server_errors = [r for r in results if r[3] >= 500]
    assert server_errors == []
    wrong_method = [r for r in results if r[2] == "wrong method" and r[3] not in (404, 405)]
    assert wrong_method == []
    # A POST of junk is refused, except the two answers that ignore the body by design:
    # logging out (303 to the login page) and Slack acknowledging a signed event it ignores.
    accepted = [r for r in results if r[0] == "POST" and r[3] not in REFUSALS
                and not (r[1] == "/admin/logout" and r[3] == 303)
                and not (r[1] == "/slack/events" and "signed=True" in r[2] and r[3] == 200)]
    assert accepted == []
    oversized = {(r[1], r[3]) for r in results if r[0] == "POST" and r[2].startswith("oversized")
                 and r[3] not in (401, 403, 429)}
    # Every route stops a 3 MiB body at its 2 MiB limit, except the chat route, which takes
    # attachments (its own limit is far higher) and so refuses this junk for what it says.
    assert {status for path, status in oversized
            if path not in ("/admin/logout", "/api/chat")} == {413}
    assert {status for path, status in oversized if path == "/api/chat"} <= {400, 413}
    assert metric(stack.gateway, "gateway_inbound_total") == 0
    assert session_files(stack.root) == []
    assert tree(stack.root) == before


# -- platform authentication -----------------------------------------------------------------


async def test_forged_or_stale_slack_signatures_are_401(stack: Stack) -> None:
    """A forged, stale, future, missing or wrong-secret Slack signature is 401; nothing kept."""
    before = tree(stack.root)
    url = stack.base + "/slack/events"
    envelope = stack.slack.dm_event(SLACK_USER, "let me in")
    body = orjson.dumps(envelope)
    now = int(time.time())
    forged = {
        "zeros": {**stack.slack.sign(body), "X-Slack-Signature": "v0=" + "0" * 64},
        "stale": stack.slack.sign(body, now - 301),
        "future": stack.slack.sign(body, now + 3600),
        "other body": stack.slack.sign(body + b" "),
        "no signature": {"X-Slack-Request-Timestamp": str(now)},
        "no timestamp": {"X-Slack-Signature": stack.slack.sign(body)["X-Slack-Signature"]},
        "junk timestamp": {**stack.slack.sign(body), "X-Slack-Request-Timestamp": "soon"},
        "v1 scheme": {**stack.slack.sign(body), "X-Slack-Signature": "v1=abc"},
    }
    statuses = {}
    for label, headers in forged.items():
        async with stack.http.post(url, data=body, headers={
                "Content-Type": "application/json", **headers}) as response:
            statuses[label] = response.status
    assert statuses == dict.fromkeys(forged, 401)
    assert dict(stack.gateway.channels[1].health())["events"] == 0
    assert tree(stack.root) == before


async def test_wrong_telegram_secret_is_403(stack: Stack) -> None:
    """A missing, wrong, truncated or differently-cased webhook secret is 403; nothing kept."""
    before = tree(stack.root)
    update = stack.telegram.user_message(TG_USER, "hello")
    stack.telegram.pending_updates.clear()
    statuses = []
    for secret in (None, "", "wrong", TG_SECRET[:-1], TG_SECRET.upper(), TG_SECRET + "x"):
        status, _ = await stack.telegram.deliver_webhook(stack.base + "/telegram/webhook",
                                                         update, secret=secret)
        statuses.append(status)
    assert statuses == [403] * 6
    assert tree(stack.root) == before


async def test_unknown_slack_user_gets_a_pairing_reply_and_no_session(stack: Stack) -> None:
    """A DM from a user not on the allowlist gets the pairing text in its thread, no session."""
    envelope = stack.slack.dm_event("U9STRANGER", "hello?")
    assert await stack.slack_event(envelope) == 200
    await wait_until(lambda: len(stack.slack.posts()) == 1)
    [post] = stack.slack.posts()
    assert post.thread_ts == envelope["event"]["ts"]
    assert "gateway pairing approve" in (post.text or "")
    assert metric(stack.gateway, "gateway_refused_total", channel="slack", reason="pairing") == 1
    assert stack.slack_turns() == 0
    assert session_files(stack.root) == []


# -- oversized messages --------------------------------------------------------------------------


async def test_megabyte_web_message_is_refused_with_413(stack: Stack) -> None:
    """A 1 MB chat message is 413 naming its length and the limit; nothing is written."""
    before = tree(stack.root)
    text = "z" * (1024 * 1024)
    status, answer = await stack.chat({"conversation": "big", "text": text})
    assert status == 413
    assert answer["error"] == f"message is {len(text)} characters long; the limit is {MAX_CHARS}"
    status, answer = await stack.chat({"conversation": "big", "text": "z" * (3 * 1024 * 1024)})
    assert status == 413
    assert answer["error"] == f"message is {3 * 1024 * 1024} characters long; the limit is " \
        f"{MAX_CHARS}"
    # Past the chat route's own body limit (room for one attachment at its limit, base64).
    limit = Settings(_env_file=None).max_request_bytes  # type: ignore[call-arg]
    status, answer = await stack.chat({"conversation": "big", "text": "z" * limit})
    assert status == 413
    assert "too large" in answer["error"]
    assert tree(stack.root) == before


async def test_longest_slack_message_is_cut_with_a_notice(stack: Stack) -> None:
    """A Slack DM as long as Slack allows (40,000 characters, with its rich-text copy) is cut
    to the limit with a notice and answered; a body over 512 KiB is a 413."""
    envelope = stack.slack.dm_event(SLACK_USER, "w" * 40_000)
    assert await stack.slack_event(envelope) == 200
    await wait_until(lambda: stack.slack_turns() == 1)
    [path] = session_files(stack.data_dir)
    text = replay_bytes(path.read_bytes()).messages[0]["content"]
    assert len(text) == MAX_CHARS
    assert text.endswith(" … [truncated]")
    assert metric(stack.gateway, "gateway_turns_total", channel="slack", outcome="answered") == 1
    await wait_until(lambda: any(p.thread_ts == envelope["event"]["ts"]
                                 for p in stack.slack.posts()))
    # Where the answer went is noted behind the turn (a Slack message posted with its text is
    # not waited for): the files hold everything of the first message once that note is in.
    await wait_until(lambda: any(orjson.loads(line).get("type") == "delivery"
                                 for line in path.read_bytes().splitlines()))
    before = tree(stack.root)
    assert await stack.slack_event(stack.slack.dm_event(SLACK_USER, "v" * (600 * 1024))) \
        == 413
    assert tree(stack.root) == before  # acknowledged only once recorded: nothing was
    await stack.slack_marker()  # the same conversation, after it: answered
    [texts] = stack.user_texts().values()
    assert [t[:20] for t in texts] == ["w" * 20, "marker"]


ENVELOPE_JUNK: list[Any] = [None, 7, "x", [], {}, [1], {"a": 1}, True, "[" * 3000]


async def test_signed_slack_envelopes_with_junk_fields_are_never_a_server_error(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """Signed envelopes with junk in any field get 200/400/404, never a 5xx or a crashed turn."""
    # Slack API errors on junk ids (a plain-text 400 from an over-long URL) are counted, not raised.
    template = stack.slack.dm_event(SLACK_USER, "hi")
    places = [("top", k) for k in template] + [("event", k) for k in template["event"]] + [
        ("auth", k) for k in template["authorizations"][0]] + [("event", "subtype")]
    answers: dict[tuple[str, str, str], int] = {}
    for where, key in places:
        for junk in ENVELOPE_JUNK:
            envelope = orjson.loads(orjson.dumps(stack.slack.dm_event(SLACK_USER, "hi")))
            target = {"top": envelope, "event": envelope["event"],
                      "auth": envelope["authorizations"][0]}[where]
            target[key] = junk
            answers[(where, key, repr(junk)[:12])] = await stack.slack_event(envelope)
    assert {k: v for k, v in answers.items() if v not in (200, 400, 404)} == {}
    await stack.slack_marker()  # after every junk turn in its conversation; then all idle
    crashes = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
               and r.name.startswith(OUR_PACKAGES)]
    assert crashes == []
    assert metric(stack.gateway, "gateway_channel_errors_total", kind="deliver") == 0
    for path in session_files(stack.data_dir):  # junk that still names a DM is a message
        assert not replay_bytes(path.read_bytes()).problems


# -- control characters and invalid UTF-8 --------------------------------------------------------

DIRTY = "a\x00b\x1b[31mc\x7fd\x85e\x08f\tg\nh\u200bi"
CLEAN = "ab[31mcdef\tg\nh\u200bi"  # C0/C1 controls go; tab, newline and format chars stay


async def test_control_characters_are_stripped_on_every_channel(stack: Stack) -> None:
    """Control characters (other than tab and newline) never reach a session, on any channel."""
    status, _ = await stack.chat({"conversation": "ctl", "text": DIRTY, "name": "n\x1bame"})
    assert status == 200
    assert await stack.slack_event(stack.slack.dm_event(SLACK_USER, DIRTY)) == 200
    update = stack.telegram.user_message(TG_USER, DIRTY)
    stack.telegram.pending_updates.clear()
    status, _ = await stack.telegram.deliver_webhook(stack.base + "/telegram/webhook",
                                                     update, secret=TG_SECRET)
    assert status == 200
    await wait_until(lambda: metric(stack.gateway, "gateway_turns_total") == 3)
    texts = {}
    for path in session_files(stack.data_dir):
        replay = replay_bytes(path.read_bytes())
        texts[replay.header["channel"]] = replay.messages[0]["content"]
    assert texts == dict.fromkeys(["web", "slack", "telegram"], CLEAN)


async def test_invalid_utf8_is_refused_and_nothing_written(stack: Stack) -> None:
    """Invalid UTF-8 (and lone surrogates on web and Telegram) is a 4xx; nothing is written."""
    # Slack answers 401 here: bolt re-verifies the signature over the decoded body, which differs.
    before = tree(stack.root)
    statuses = []
    for text in (b'"\xff\xfe"', b'"\xc3"', b'"\\udc00"'):
        status, answer = await stack.chat(b'{"conversation":"u","text":' + text + b"}")
        statuses.append(("web", status, answer["error"]))
        update = orjson.dumps(stack.telegram.user_message(TG_USER, "placeholder"))
        stack.telegram.pending_updates.clear()
        status, _ = await stack.request(
            "POST", "/telegram/webhook", update.replace(b'"placeholder"', text),
            {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": TG_SECRET})
        statuses.append(("telegram", status, ""))
        if text != b'"\\udc00"':
            envelope = orjson.dumps(stack.slack.dm_event(SLACK_USER, "placeholder"))
            body = envelope.replace(b'"placeholder"', text)
            status, _ = await stack.request("POST", "/slack/events", body, {
                "Content-Type": "application/json", **stack.slack.sign(body)})
            statuses.append(("slack", status, ""))
    assert all(400 <= status < 500 for _, status, _ in statuses), statuses
    assert [s[2] for s in statuses if s[0] == "web"] == [
        "request body is not valid UTF-8", "request body is not valid UTF-8",
        "request body is not valid JSON"]
    assert tree(stack.root) == before  # acknowledged only once recorded: nothing was
    marker = await stack.slack_marker()  # the Slack DM's conversation, after them: answered
    assert stack.user_texts() == {f"slack:{marker['event']['channel']}": ["marker"]}


async def test_lone_surrogate_from_slack_is_dropped_not_a_failed_write(stack: Stack) -> None:
    """A lone surrogate in a Slack DM is dropped: the message is recorded, not a failed write."""
    envelope = orjson.dumps(stack.slack.dm_event(SLACK_USER, "placeholder"))
    body = envelope.replace(b'"placeholder"', b'"be\\udc00fore"')
    status, _ = await stack.request("POST", "/slack/events", body, {
        "Content-Type": "application/json", **stack.slack.sign(body)})
    assert status == 200
    await wait_until(lambda: stack.slack_turns() == 1)
    assert metric(stack.gateway, "gateway_persist_failures_total") == 0
    [path] = session_files(stack.data_dir)
    replay = replay_bytes(path.read_bytes())
    assert [m["content"] for m in replay.messages][:1] == ["before"]
    assert replay.problems == ()
