"""The Slack channel end to end: the real gateway, bolt and slack_sdk against the fake Slack."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from app.cli import main as cli_main
from app.compose import build_gateway
from app.compose_channels import slack_channel
from app.config import Settings
from app.server import Gateway
from channels.slack.adapter import SlackChannel
from channels.slack.render import render_chunks
from coordination.local import InProcessCoordinator
from gateway.edge.errors import ConfigError
from gateway.edge.metrics import Metrics
from gateway.edge.provider import Provider, ProviderRequest, ProviderResponse, TextSink
from providers.anthropic import AnthropicProvider
from sessions.replay import replay_bytes
from tests.fakes.providers import FakeProviderServer, Reply, content_text
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.slack_api import FakeSlackServer
from tests.waiting import WAIT, until

wait_until = until  # polled waits: see tests/waiting.py

TEAM = "T0FAKETEAM"
GENERAL = "C0FAKEGEN"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlackServer]:
    async with FakeSlackServer() as server:
        yield server


def slack_settings(fake: FakeSlackServer, data_dir: Path, **extra: Any) -> Settings:
    """Settings for a Slack-only gateway on 127.0.0.1 talking to ``fake``."""
    values: dict[str, Any] = {
        "GATEWAY_DATA_DIR": str(data_dir), "GATEWAY_PORT": 0, "GATEWAY_CHANNELS": "slack",
        "SLACK_BOT_TOKEN": fake.bot_token, "SLACK_SIGNING_SECRET": fake.signing_secret,
        "SLACK_API_BASE_URL": fake.api_base_url, "SLACK_ALLOWED_USERS": "U1,U2",
        "GATEWAY_TYPING_DELAY": 0,
    }
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]  # pydantic-settings init


@asynccontextmanager
async def running(settings: Settings, provider: Provider | None = None) -> AsyncIterator[Gateway]:
    gateway = build_gateway(settings, provider=provider or ScriptedProvider())
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.aclose()


def events_url(gateway: Gateway) -> str:
    return f"http://127.0.0.1:{gateway.bound_port}/slack/events"


def metric(gateway: Gateway, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in gateway.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def turns(gateway: Gateway) -> float:
    return metric(gateway, "gateway_turns_total", channel="slack")


def duplicates(gateway: Gateway) -> float:
    return metric(gateway, "gateway_duplicates_dropped_total", channel="slack")




def thread_texts(fake: FakeSlackServer, channel: str, thread_ts: str) -> list[str]:
    """What the bot shows in a thread now (edits applied), oldest first."""
    found = sorted((ts, m) for (c, ts), m in fake.messages.items()
                   if c == channel and m.get("bot_id") == fake.bot_id
                   and m.get("thread_ts") == thread_ts)
    return [m["text"] for _, m in found]


def methods(fake: FakeSlackServer) -> list[str]:
    return [call.method for call in fake.calls]


async def sessions(gateway: Gateway) -> list[tuple[str | None, str | None]]:
    """(conversation, first user text) of every session of the Slack team, sorted."""
    infos = await gateway.store.list_sessions(TEAM)
    return sorted((info.conversation, info.first_user_text) for info in infos)


async def test_dm_round_trip_in_thread(fake: FakeSlackServer, tmp_path: Path) -> None:
    """A DM is recorded and answered in its thread (a quick reply: mrkdwn final, no preview)."""
    provider = ScriptedProvider()
    provider.script("**Hello** there")
    async with running(slack_settings(fake, tmp_path), provider) as gateway:
        envelope = fake.dm_event("U1", "hi &lt;b&gt; &amp; bye")
        event = envelope["event"]
        assert await fake.deliver_event(events_url(gateway), envelope) == (200, "")
        await wait_until(lambda: turns(gateway) == 1)
        assert await sessions(gateway) == [(f"slack:{event['channel']}", "hi <b> & bye")]
        async with aiohttp.ClientSession() as http, http.get(
            f"http://127.0.0.1:{gateway.bound_port}/healthz"
        ) as response:
            health = (await response.json())["channels"]["slack"]
    assert thread_texts(fake, event["channel"], event["ts"]) == ["*Hello* there"]
    # The name lookup runs beside the turn (never before the ack), so its place may vary.
    assert "users.info" in methods(fake)
    # One auth.test: the channel's own at start. A person's message skips bolt, whose own
    # auth.test on the first request it dispatches would be a second.
    assert [m for m in methods(fake) if m != "users.info"] == [
        "auth.test", "reactions.add", "chat.postMessage", "reactions.remove"]
    assert fake.reactions == {(event["channel"], event["ts"]): set()}
    assert health == {"ok": True, "mode": "http", "events": 1, "last_error": None}
    assert (tmp_path / "tenants" / TEAM / "sessions").is_dir()


async def test_mention_twin_answered_once(fake: FakeSlackServer, tmp_path: Path) -> None:
    """app_mention and its message twin make one session message and one reply, mention stripped."""
    async with running(slack_settings(fake, tmp_path)) as gateway:
        mention, message = fake.mention_events("U1", "what's up?")
        for envelope in (mention, message):
            assert (await fake.deliver_event(events_url(gateway), envelope))[0] == 200
        await wait_until(lambda: turns(gateway) == 1 and duplicates(gateway) == 1)
        ts = mention["event"]["ts"]
        # A channel is shared: the recorded message names its speaker (no name cached yet).
        assert await sessions(gateway) == [(f"slack:{GENERAL}:{ts}", "[U1] what's up?")]
    assert thread_texts(fake, GENERAL, ts) == ["ok"]


async def test_retried_event_answered_once(fake: FakeSlackServer, tmp_path: Path) -> None:
    """A retry (X-Slack-Retry-Num) of an event already acknowledged is dropped."""
    async with running(slack_settings(fake, tmp_path)) as gateway:
        envelope = fake.dm_event("U1", "hello")
        assert (await fake.deliver_event(events_url(gateway), envelope))[0] == 200
        retry = await fake.deliver_event(events_url(gateway), envelope, retry_num=1)
        assert retry[0] == 200
        await wait_until(lambda: turns(gateway) == 1 and duplicates(gateway) == 1)
    event = envelope["event"]
    assert thread_texts(fake, event["channel"], event["ts"]) == ["ok"]
    assert len(fake.posts()) == 1


async def test_redelivery_after_restart_answered_once(
    fake: FakeSlackServer, tmp_path: Path
) -> None:
    """The same event delivered to a new gateway on the same data dir is not answered again."""
    settings = slack_settings(fake, tmp_path)
    envelope = fake.dm_event("U1", "hello")
    async with running(settings) as first:
        assert (await fake.deliver_event(events_url(first), envelope))[0] == 200
        await wait_until(lambda: turns(first) == 1)
    async with running(settings) as second:
        status, _ = await fake.deliver_event(events_url(second), envelope, retry_num=2)
        assert status == 200
        await wait_until(lambda: duplicates(second) == 1)
        assert turns(second) == 0
        infos = await second.store.list_sessions(TEAM)
    assert [info.message_count for info in infos] == [2]
    assert len(fake.posts()) == 1
    assert (tmp_path / "state" / "delivery.jsonl").is_file()  # the owed journal remembers it


@pytest.mark.parametrize(("body", "signed", "expected"), [
    (b"\xff\xfe{not json", False, 401),
    (b"[1]", True, 400),
    (b"payload=%7Bbroken", True, 400),
    # A person's message event, which skips bolt, with fields of the wrong type.
    (b'{"type": "event_callback", "event": {"type": "message", "channel_type": ["im"]}}',
     True, 400),
    (b'{"type": "event_callback", "event": {"type": "app_mention"}, "authorizations": {}}',
     True, 400),
])
async def test_junk_request_refused(
    fake: FakeSlackServer, tmp_path: Path, body: bytes, signed: bool, expected: int
) -> None:
    """Junk bodies get 401 (unsigned) or 400 (signed but unparseable), never a server error."""
    headers = {"Content-Type": "application/json", **(fake.sign(body) if signed else {})}
    async with running(slack_settings(fake, tmp_path)) as gateway, aiohttp.ClientSession() as http:
        async with http.post(events_url(gateway), data=body, headers=headers) as response:
            status = response.status
        health = dict(gateway.channels[0].health())
    assert status == expected
    assert health["events"] == 0


@pytest.mark.parametrize("forgery", ["signature", "stale"])
async def test_forged_or_stale_request_refused(
    fake: FakeSlackServer, tmp_path: Path, forgery: str
) -> None:
    """A bad signature or a timestamp over 5 minutes old gets 401 and leaves nothing behind."""
    async with running(slack_settings(fake, tmp_path)) as gateway:
        envelope = fake.dm_event("U1", "let me in")
        if forgery == "signature":
            result = await fake.deliver_event(events_url(gateway), envelope,
                                              signature="v0=" + "0" * 64)
        else:
            result = await fake.deliver_event(events_url(gateway), envelope,
                                              timestamp=int(time.time()) - 301)
        health = dict(gateway.channels[0].health())
        assert await sessions(gateway) == []
    assert result[0] == 401
    assert health["events"] == 0
    assert methods(fake) == ["auth.test"]
    assert not (tmp_path / "tenants").exists()


async def test_url_verification_echoes_challenge(fake: FakeSlackServer, tmp_path: Path) -> None:
    """Slack's url_verification handshake is answered with its challenge."""
    async with running(slack_settings(fake, tmp_path)) as gateway:
        status, body = await fake.deliver_url_verification(events_url(gateway))
    challenge = orjson.loads(fake.deliveries[-1].body)["challenge"]
    assert status == 200
    assert orjson.loads(body) == {"challenge": challenge}


async def test_long_markdown_reply_split_in_thread(fake: FakeSlackServer, tmp_path: Path) -> None:
    """A long quick reply becomes mrkdwn chunks posted in order in the thread."""
    markdown = "\n\n".join(f"Paragraph {n}: **bold** and `code` " + "word " * 60
                           for n in range(30))
    expected = render_chunks(markdown)
    provider = ScriptedProvider()
    provider.script(markdown)
    async with running(slack_settings(fake, tmp_path), provider) as gateway:
        envelope = fake.dm_event("U1", "write a lot")
        await fake.deliver_event(events_url(gateway), envelope)
        await wait_until(lambda: turns(gateway) == 1)
    event = envelope["event"]
    assert len(expected) >= 3
    assert all(len(chunk) <= 3000 for chunk in expected)
    assert thread_texts(fake, event["channel"], event["ts"]) == expected
    assert [c.method for c in fake.calls if c.method.startswith("chat.")] == [
        "chat.postMessage"] * len(expected)


async def test_rate_limited_post_is_retried(fake: FakeSlackServer, tmp_path: Path) -> None:
    """chat.postMessage answered 429 with Retry-After is retried after it and delivered."""
    fake.fail_next("chat.postMessage", "ratelimited", retry_after=1)
    async with running(slack_settings(fake, tmp_path)) as gateway:
        envelope = fake.dm_event("U1", "hello")
        await fake.deliver_event(events_url(gateway), envelope)
        await wait_until(lambda: turns(gateway) == 1, timeout=WAIT)
        errors = metric(gateway, "gateway_channel_errors_total", channel="slack")
    event = envelope["event"]
    posts = fake.calls_of("chat.postMessage")
    assert [(c.http_status, c.error) for c in posts] == [(429, "ratelimited"), (200, None)]
    assert posts[1].time - posts[0].time >= 1.0
    assert thread_texts(fake, event["channel"], event["ts"]) == ["ok"]
    assert errors == 0


async def test_bot_and_other_events_ignored(fake: FakeSlackServer, tmp_path: Path) -> None:
    """Our own messages, edits and unrelated events get a 200 and no turn; a real DM still works."""
    async with running(slack_settings(fake, tmp_path)) as gateway:
        dm = fake.im_channel_for("U1")
        ignored = [
            fake.message_event(dm, "my own reply", user=fake.bot_user_id, bot_id=fake.bot_id),
            fake.message_event(dm, "edited", user="U1", subtype="message_changed"),
            fake.message_event(GENERAL, "chatter without a mention", user="U1"),
            fake.envelope({"type": "reaction_added", "user": "U1", "reaction": "tada",
                           "item": {"type": "message", "channel": dm, "ts": "1.000001"},
                           "event_ts": fake.next_ts()}),
        ]
        statuses = [(await fake.deliver_event(events_url(gateway), e))[0] for e in ignored]
        real = fake.dm_event("U1", "the real one")
        await fake.deliver_event(events_url(gateway), real)
        await wait_until(lambda: turns(gateway) == 1)
        assert await sessions(gateway) == [(f"slack:{dm}", "the real one")]
    assert statuses == [200, 200, 200, 200]
    assert [c.thread_ts for c in fake.posts()] == [real["event"]["ts"]]


async def test_people_skip_bolt_and_everything_else_goes_through_it(
        fake: FakeSlackServer, tmp_path: Path) -> None:
    """A person's message is taken without bolt's dispatch (the gateway's one auth.test, at
    start, tells it our bot); any other request still goes to bolt, which makes its own
    auth.test the first time, and acknowledges it."""
    async with running(slack_settings(fake, tmp_path)) as gateway:
        dm = fake.im_channel_for("U1")
        first = fake.dm_event("U1", "first")
        own = fake.message_event(dm, "my own reply", user=fake.bot_user_id, bot_id=fake.bot_id)
        statuses = [(await fake.deliver_event(events_url(gateway), e))[0] for e in (first, own)]
        await wait_until(lambda: turns(gateway) == 1)
        before_bolt = methods(fake).count("auth.test")
        reaction = fake.envelope({"type": "reaction_added", "user": "U1", "reaction": "tada",
                                  "item": {"type": "message", "channel": dm,
                                           "ts": first["event"]["ts"]},
                                  "event_ts": fake.next_ts()})
        statuses.append((await fake.deliver_event(events_url(gateway), reaction))[0])
        second = fake.dm_event("U1", "second")
        statuses.append((await fake.deliver_event(events_url(gateway), second))[0])
        await wait_until(lambda: turns(gateway) == 2)
        infos = await gateway.store.list_sessions(TEAM)
    assert statuses == [200, 200, 200, 200]
    assert before_bolt == 1
    assert methods(fake).count("auth.test") == 2  # bolt's, for the reaction only
    assert [info.message_count for info in infos] == [4]  # two messages, two answers


async def test_unknown_user_gets_pairing_code(fake: FakeSlackServer, tmp_path: Path) -> None:
    """With no allowlist, a stranger's DM is answered with a pairing code and leaves no session."""
    settings = slack_settings(fake, tmp_path, SLACK_ALLOWED_USERS="")
    async with running(settings) as gateway:
        envelope = fake.dm_event("U9", "hello?")
        await fake.deliver_event(events_url(gateway), envelope)
        await wait_until(lambda: len(fake.posts()) == 1)
        refused = metric(gateway, "gateway_refused_total", channel="slack", reason="pairing")
        assert await sessions(gateway) == []
    event = envelope["event"]
    [reply] = thread_texts(fake, event["channel"], event["ts"])
    assert "gateway pairing approve" in reply
    assert refused == 1
    assert turns(gateway) == 0
    assert not (tmp_path / "tenants" / TEAM / "sessions").exists()


async def test_two_threads_two_sessions_in_team_tenant(
    fake: FakeSlackServer, tmp_path: Path
) -> None:
    """Each thread in a channel is its own session, stored under the team's tenant directory."""
    async with running(slack_settings(fake, tmp_path)) as gateway:
        url = events_url(gateway)
        first = fake.mention_events("U1", "first thread")[0]
        second = fake.mention_events("U2", "second thread")[0]
        ts1, ts2 = first["event"]["ts"], second["event"]["ts"]
        follow_up = fake.mention_events("U2", "more in the first", thread_ts=ts1)[0]
        for envelope in (first, second, follow_up):
            await fake.deliver_event(url, envelope)
        await wait_until(lambda: turns(gateway) == 3)
        infos = await gateway.store.list_sessions(TEAM)
    assert sorted((i.conversation, i.message_count) for i in infos) == [
        (f"slack:{GENERAL}:{ts1}", 4), (f"slack:{GENERAL}:{ts2}", 2)]
    files = sorted(p.name for p in (tmp_path / "tenants" / TEAM / "sessions").iterdir())
    assert files == sorted(f"{i.session_id}.jsonl" for i in infos)
    assert thread_texts(fake, GENERAL, ts1) == ["ok", "ok"]
    assert thread_texts(fake, GENERAL, ts2) == ["ok"]


class GatedProvider(ScriptedProvider):
    """A scripted provider whose calls wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.called = asyncio.Event()

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        self.called.set()
        await self.gate.wait()
        return await super().complete(request, on_text)


async def test_event_acknowledged_before_its_turn(fake: FakeSlackServer, tmp_path: Path) -> None:
    """Slack gets its 200 while the turn is still waiting on the provider."""
    provider = GatedProvider()
    events: list[str] = []
    async with running(slack_settings(fake, tmp_path), provider) as gateway:
        envelope = fake.dm_event("U1", "slow one")
        status, _ = await fake.deliver_event(events_url(gateway), envelope)
        events.append(f"acknowledged {status}")
        await asyncio.wait_for(provider.called.wait(), WAIT)
        events.append(f"turn running, finished turns: {turns(gateway):.0f}")
        provider.gate.set()
        await wait_until(lambda: turns(gateway) == 1)
        events.append("answered")
    assert events == ["acknowledged 200", "turn running, finished turns: 0", "answered"]


async def test_replay_matches_provider_requests(fake: FakeSlackServer, tmp_path: Path) -> None:
    """Every request the provider got through Slack turns equals the replay's request for it."""
    async with FakeProviderServer() as srv:
        srv.script("anthropic", Reply.text("first answer"), Reply.text("**second** answer"))
        provider = AnthropicProvider(api_key="test", model="claude-test",
                                     base_url=srv.anthropic_base_url, max_retries=0)
        async with running(slack_settings(fake, tmp_path), provider) as gateway:
            dm = fake.im_channel_for("U1")
            await fake.deliver_event(events_url(gateway), fake.dm_event("U1", "hello"))
            await wait_until(lambda: turns(gateway) == 1)
            await fake.deliver_event(events_url(gateway), fake.dm_event("U1", "and again"))
            await wait_until(lambda: turns(gateway) == 2)
            [info] = await gateway.store.list_sessions(TEAM)
            replay = replay_bytes(await gateway.store.read_log(TEAM, info.session_id))
        bodies = [r.body for r in srv.requests_for("anthropic")]
    assert info.conversation == f"slack:{dm}"
    assert len(bodies) == len(replay.calls) == 2
    assert [replay.request(turn) for turn in replay.calls] == bodies
    assert content_text(bodies[1]["messages"][-1]["content"]) == "and again"


async def test_replay_cli_request_matches(fake: FakeSlackServer, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`gateway replay ID --tenant TEAM --request 1` prints the body the provider received."""
    async with FakeProviderServer() as srv:
        provider = AnthropicProvider(api_key="test", model="claude-test",
                                     base_url=srv.anthropic_base_url, max_retries=0)
        async with running(slack_settings(fake, tmp_path), provider) as gateway:
            await fake.deliver_event(events_url(gateway), fake.dm_event("U1", "hello"))
            await wait_until(lambda: turns(gateway) == 1)
            [info] = await gateway.store.list_sessions(TEAM)
        [received] = srv.requests_for("anthropic")
    code = await asyncio.to_thread(cli_main, [
        "replay", info.session_id, "--tenant", TEAM, "--request", "1",
        "--data-dir", str(tmp_path)])
    assert code == 0
    assert orjson.loads(capsys.readouterr().out) == received.body


def test_missing_settings_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No bot token, or HTTP mode without a signing secret, is a ConfigError naming the setting."""
    for name in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    base: dict[str, Any] = {"GATEWAY_DATA_DIR": str(tmp_path), "GATEWAY_CHANNELS": "slack"}
    without_token = Settings(_env_file=None, **base)  # type: ignore[call-arg]
    without_secret = Settings(_env_file=None, SLACK_BOT_TOKEN="xoxb-1", **base)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="SLACK_BOT_TOKEN"):
        slack_channel(without_token, Metrics(), InProcessCoordinator())
    with pytest.raises(ConfigError, match="SLACK_SIGNING_SECRET"):
        slack_channel(without_secret, Metrics(), InProcessCoordinator())


async def test_turn_running_at_shutdown_still_replies(
    fake: FakeSlackServer, tmp_path: Path
) -> None:
    """Once the router stops taking input, a new event gets 503 (not acknowledged, so Slack
    retries) and leaves no trace, while the turn in flight still replies through the channel."""
    provider = GatedProvider()
    gateway = build_gateway(slack_settings(fake, tmp_path), provider=provider)
    await gateway.start()
    url = events_url(gateway)
    envelope = fake.dm_event("U1", "answer me while stopping")
    try:
        await fake.deliver_event(url, envelope)
        await asyncio.wait_for(provider.called.wait(), WAIT)
        closing = asyncio.create_task(gateway.aclose())
        await wait_until(lambda: gateway.router.closing)
        late = await fake.deliver_event(url, fake.dm_event("U1", "too late"))
        provider.gate.set()
        await closing
    finally:
        await gateway.aclose()
    event = envelope["event"]
    assert late[0] == 503
    assert thread_texts(fake, event["channel"], event["ts"]) == ["ok"]
    [session] = list((tmp_path / "tenants" / TEAM / "sessions").iterdir())
    assert b"too late" not in session.read_bytes()


async def test_late_event_retried_after_restart_is_answered(
    fake: FakeSlackServer, tmp_path: Path
) -> None:
    """An event refused with 503 at shutdown is taken (recorded, answered) when Slack retries
    it against the next gateway on the same data dir."""
    settings = slack_settings(fake, tmp_path)
    late = fake.dm_event("U1", "too late")
    async with running(settings) as first:
        await first.router.drain(0)  # as in shutdown: the router takes no more input
        refused = await fake.deliver_event(events_url(first), late)
    async with running(settings) as second:
        retried = await fake.deliver_event(events_url(second), late, retry_num=1)
        await wait_until(lambda: turns(second) == 1)
        assert await sessions(second) == [(f"slack:{late['event']['channel']}", "too late")]
    assert (refused[0], retried[0]) == (503, 200)
    assert thread_texts(fake, late["event"]["channel"], late["event"]["ts"]) == ["ok"]


async def test_event_not_recorded_gets_503_and_retry_is_taken(
    fake: FakeSlackServer, tmp_path: Path
) -> None:
    """When the store cannot record the message Slack gets a 503, and its retry is taken once
    the store works again (the failed attempt left no redelivery mark behind)."""
    async with running(slack_settings(fake, tmp_path)) as gateway:
        blocker = tmp_path / "tenants"
        blocker.write_text("not a directory")  # the team's session directory cannot be made
        envelope = fake.dm_event("U1", "keep me")
        failed = await fake.deliver_event(events_url(gateway), envelope)
        blocker.unlink()
        retried = await fake.deliver_event(events_url(gateway), envelope, retry_num=1)
        await wait_until(lambda: turns(gateway) == 1)
        assert await sessions(gateway) == [(f"slack:{envelope['event']['channel']}", "keep me")]
    assert (failed[0], retried[0]) == (503, 200)
    assert thread_texts(fake, envelope["event"]["channel"], envelope["event"]["ts"]) == ["ok"]
    assert duplicates(gateway) == 0


async def test_ack_never_waits_for_the_name_lookup(fake: FakeSlackServer, tmp_path: Path) -> None:
    """A slow users.info holds up no acknowledgement: the first message is recorded without the
    sender's names, a later one with the names the background lookup cached."""
    lookup = fake.hold_next("users.info")
    async with running(slack_settings(fake, tmp_path)) as gateway:
        first = await fake.deliver_event(events_url(gateway), fake.dm_event("U1", "one"))
        # users.info is still held here; released only now. Had the acknowledgement waited
        # for it, the lookup would have run into its 2 s timeout and U1 would go nameless.
        lookup.set()
        channel = gateway.channels[0]
        assert isinstance(channel, SlackChannel)
        await wait_until(lambda: channel.names_cached("U1"))
        second = await fake.deliver_event(events_url(gateway), fake.dm_event("U1", "two"))
        await wait_until(lambda: turns(gateway) == 2)
        [info] = await gateway.store.list_sessions(TEAM)
        log = replay_bytes(await gateway.store.read_log(TEAM, info.session_id))
    metas = [log.messages.entry(i).get("meta", {}) for i in range(len(log.messages))
             if log.messages[i]["role"] == "user"]
    assert (first[0], second[0]) == (200, 200)
    assert [m.get("name") for m in metas] == [None, "user_u1"]
