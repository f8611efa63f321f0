"""People stay apart, as a property: over generated interleavings of people, tenants, DMs and
groups on the web chat, Telegram (real PTB) and Slack (real slack-bolt), against the fake
platforms and a fake Anthropic server driven by the real SDK, a secret the model saves in one
memory scope never appears in a request body another scope's call sent, nor in another
scope's session log; and it does appear in every later call of its own scope.

Each step says one message and waits until its turn is over, so the provider requests made
during a step are that step's conversation's (nothing here relies on reading the system under
test to attribute them). The fake model saves ``SECRET-n`` with memory_write whenever a
message asks it to remember one. Hypothesis generates the plans (derandomized: the same plans
every run); an explicit example has every conversation save a secret and then speak again.
"""

from __future__ import annotations

import asyncio
import copy
import re
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.compose import build_gateway
from app.config import Settings
from app.server import Gateway
from channels.web.identity import COOKIE
from gateway.edge.ids import WEB_TENANT
from providers.anthropic import AnthropicProvider
from sessions.replay import replay_bytes
from tests.e2e.replaying import assert_replay_shows_what_was_read, system_read
from tests.fakes.providers import ApiName, FakeProviderServer, Reply, last_user_text
from tests.fakes.slack_api import FakeSlackServer
from tests.fakes.telegram_api import FakeTelegramServer
from tests.waiting import until

TEAM_A, TEAM_B = "T0TEAMA", "T0TEAMB"
GROUP = -100500
SLACK_CHANNEL = "C0SHARED"  # the same channel id in both workspaces: tenants keep them apart


@dataclass(frozen=True)
class Actor:
    """Someone writing in one conversation; ``scope`` is the memory scope the test expects
    (tenant, channel, kind, id), derived here from the rules, not read from the gateway."""

    name: str
    channel: str
    scope: tuple[str, str, str, str]


ACTORS = [
    # The web chat is its own tenant (the shipped default).
    Actor("web-ada", "web", (WEB_TENANT, "web", "person", "ada")),
    Actor("web-bob", "web", (WEB_TENANT, "web", "person", "bob")),
    Actor("tg-alice-dm", "telegram", ("default", "telegram", "person", "1001")),
    Actor("tg-bob-dm", "telegram", ("default", "telegram", "person", "1002")),
    Actor("tg-group-alice", "telegram", ("default", "telegram", "chat", str(GROUP))),
    Actor("tg-group-bob", "telegram", ("default", "telegram", "chat", str(GROUP))),
    Actor("slack-a-u1-dm", "slack", (TEAM_A, "slack", "person", "U1")),
    Actor("slack-a-u2-dm", "slack", (TEAM_A, "slack", "person", "U2")),
    Actor("slack-a-u1-channel", "slack", (TEAM_A, "slack", "chat", SLACK_CHANNEL)),
    Actor("slack-a-u2-channel", "slack", (TEAM_A, "slack", "chat", SLACK_CHANNEL)),
    Actor("slack-b-u1-dm", "slack", (TEAM_B, "slack", "person", "U1")),
    Actor("slack-b-u1-channel", "slack", (TEAM_B, "slack", "chat", SLACK_CHANNEL)),
]
BY_NAME = {a.name: a for a in ACTORS}
SECRET = re.compile(r"SECRET-\d{3}")  # fixed width: no secret is a prefix of another

Step = tuple[str, bool]
"""(actor name, whether the message asks the model to remember a new secret)"""


def model(api: ApiName, body: dict[str, Any]) -> Reply:
    """The fake model: acknowledges a tool result; saves a secret it is asked to remember."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
        return Reply.text("saved")
    found = SECRET.search(last_user_text(body))
    if found and "remember" in last_user_text(body):
        return Reply.tool_use("memory_write", {"text": f"the code is {found.group()}"})
    return Reply.text("hello")


def system_text(body: dict[str, Any]) -> str:
    """The system prompt an Anthropic body carries, as the model reads it: a string, or text
    blocks (with cache breakpoints) one after the other."""
    return system_read(body) or ""


def in_team(envelope: dict[str, Any], team: str) -> dict[str, Any]:
    """The same event as Slack sends it for another workspace that installed the app."""
    changed = copy.deepcopy(envelope)
    changed["team_id"] = changed["context_team_id"] = team
    changed["event"]["team"] = team
    for authorization in changed["authorizations"]:
        authorization["team_id"] = team
    return changed


@dataclass
class World:
    gateway: Gateway
    provider: FakeProviderServer
    telegram: FakeTelegramServer
    slack: FakeSlackServer
    cookies: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.gateway.bound_port}"

    async def browser(self, actor: Actor) -> str:
        """The identity cookie of ``actor``'s browser (each web actor is its own person: the
        server says who, by the cookie its chat page set)."""
        if actor.name not in self.cookies:
            async with aiohttp.ClientSession() as http, http.get(f"{self.base}/") as page:
                self.cookies[actor.name] = page.cookies[COOKIE].value
        return self.cookies[actor.name]

    def turns(self) -> float:
        return sum(sample.value for family in self.gateway.metrics.registry.collect()
                   for sample in family.samples if sample.name == "gateway_turns_total")

    async def say(self, actor: Actor, text: str, done: int) -> str:
        """Send ``text`` as ``actor``; return once its turn (the ``done``-th) is over, with
        the conversation's label as the channel's rules make it."""
        if actor.channel == "web":
            cookie = await self.browser(actor)
            # The conversation is keyed under its person (``c-`` and the cookie's id).
            label = f"web:c-{cookie.partition('.')[0]}.{actor.scope[3]}"
            async with aiohttp.ClientSession() as http, http.post(
                f"{self.base}/api/chat",
                json={"conversation": actor.scope[3], "text": text, "name": actor.name},
                headers={"Cookie": f"{COOKIE}={cookie}"},
            ) as response:
                assert response.status == 200, await response.text()
        elif actor.name.startswith("tg-group"):
            user = 1001 if "alice" in actor.name else 1002
            self.telegram.user_message(GROUP, text, user_id=user, chat_type="supergroup",
                                       first_name=actor.name.split("-")[-1].title())
            label = f"telegram:{GROUP}"
        elif actor.channel == "telegram":
            self.telegram.user_message(int(actor.scope[3]), text, first_name=actor.name)
            label = f"telegram:{actor.scope[3]}"
        else:
            user = "U2" if "-u2-" in actor.name else "U1"
            if actor.name.endswith("-dm"):
                envelope = self.slack.dm_event(user, text)
                label = f"slack:{self.slack.im_channel_for(user)}"
            else:
                envelope = self.slack.mention_events(user, text, channel=SLACK_CHANNEL)[0]
                label = f"slack:{SLACK_CHANNEL}:{envelope['event']['ts']}"  # a new thread
            envelope = in_team(envelope, actor.scope[0])
            status, _ = await self.slack.deliver_event(f"{self.base}/slack/events", envelope)
            assert status == 200
        await until(lambda: self.turns() >= done)
        return label


@asynccontextmanager
async def world(data: Path) -> AsyncIterator[World]:
    async with FakeProviderServer() as provider, FakeTelegramServer() as telegram, \
            FakeSlackServer(team_id=TEAM_A) as slack:
        provider.default = model
        settings = Settings(  # type: ignore[call-arg]  # pydantic-settings init options
            _env_file=None, GATEWAY_DATA_DIR=str(data), GATEWAY_PORT=0,
            GATEWAY_CHANNELS="web,telegram,slack", GATEWAY_TYPING_DELAY=0,
            TELEGRAM_BOT_TOKEN=telegram.token, TELEGRAM_API_BASE_URL=telegram.base_url,
            TELEGRAM_RATE_LIMIT="off", TELEGRAM_POLL_TIMEOUT=1, TELEGRAM_GROUP_MODE="all",
            TELEGRAM_ALLOWED_USERS="1001,1002",
            SLACK_BOT_TOKEN=slack.bot_token, SLACK_SIGNING_SECRET=slack.signing_secret,
            SLACK_API_BASE_URL=slack.api_base_url, SLACK_ALLOWED_USERS="U1,U2",
        )
        anthropic = AnthropicProvider(api_key="test-key", model="claude-test",
                                      base_url=provider.anthropic_base_url, max_retries=0)
        gateway = build_gateway(settings, provider=anthropic)
        await gateway.start()
        try:
            yield World(gateway, provider, telegram, slack)
        finally:
            await gateway.aclose()


async def run_plan(plan: list[Step], data: Path) -> None:
    written: dict[str, tuple[str, str, str, str]] = {}  # secret -> the scope that saved it
    per_step: list[tuple[Actor, list[bytes], list[dict[str, Any]]]] = []
    conversations: dict[tuple[str, str], set[tuple[str, str, str, str]]] = {}
    async with world(data) as w:
        for n, (name, remember) in enumerate(plan, start=1):
            actor = BY_NAME[name]
            text = f"remember SECRET-{n:03d}" if remember else f"how are you, message {n}?"
            first = len(w.provider.requests)
            label = await w.say(actor, text, n)
            conversations.setdefault((actor.scope[0], label), set()).add(actor.scope)
            calls = w.provider.requests[first:]
            assert calls, f"step {n} ({name}) made no provider call"
            per_step.append((actor, [r.raw for r in calls], [r.body for r in calls]))
            if remember:
                written[f"SECRET-{n:03d}"] = actor.scope
        logs = [(info, await w.gateway.store.read_log(info.tenant, info.session_id))
                for info in await w.gateway.store.list_sessions()]
        # A web actor's person is the identity its browser was given (``c-`` and the id in its
        # cookie), not the name the plan calls it by.
        web_person = {BY_NAME[name].scope: "c-" + cookie.partition(".")[0]
                      for name, cookie in w.cookies.items()}

    for n, (actor, raws, bodies) in enumerate(per_step, start=1):
        for secret, owner in written.items():
            if owner != actor.scope:
                assert not any(secret.encode() in raw for raw in raws), (
                    f"step {n}: {actor.name}'s call carried {secret} of {owner}")
        # Every secret its scope saved before this step is in each call's system prompt...
        earlier = [s for s, owner in written.items()
                   if owner == actor.scope and int(s.split("-")[1]) < n]
        for body in bodies:
            assert all(s in system_text(body) for s in earlier), (n, actor.name, earlier)
        # ...and the one saved during this step from the call right after the tool round on.
        if f"SECRET-{n:03d}" in written:
            assert f"SECRET-{n:03d}" in system_text(bodies[-1])

    assert {(info.tenant, info.conversation) for info, _ in logs} == set(conversations)
    for info, log in logs:
        assert_replay_shows_what_was_read(replay_bytes(log))
        # Each conversation has exactly the scope the rules give it, and its header says so.
        (own,) = conversations[(info.tenant, info.conversation or "")]
        scope = orjson.loads(log.split(b"\n", 1)[0])["scope"]
        assert (info.tenant, info.channel, scope["kind"], scope["id"]) == (
            *own[:3], web_person.get(own, own[3]))
        for secret, owner in written.items():
            if owner != own:
                assert secret.encode() not in log, f"{secret} of {owner} in the log of {own}"


STEPS = st.lists(st.tuples(st.sampled_from([a.name for a in ACTORS]), st.booleans()),
                 min_size=3, max_size=12)
EVERYONE_TWICE = [(a.name, True) for a in ACTORS] + [(a.name, False) for a in ACTORS]


@settings(max_examples=10, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@example(plan=EVERYONE_TWICE)
@given(plan=STEPS)
def test_a_secret_stays_in_its_scope(plan: list[Step]) -> None:
    """For any interleaving: no call or log of another scope carries a scope's secret, and
    every later call of its own scope does."""
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run_plan(plan, Path(tmp) / "data"))
