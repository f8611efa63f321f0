"""The router: ordering per conversation, concurrency across them, dedup, /new, idle rotation."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from coordination.file_pairing import FilePairingState
from gateway.access.gate import PAIRING_REPLY_WINDOW, AccessGate, AccessPolicy, ChannelRules
from gateway.access.pairing_live import LivePairing
from gateway.edge.channel import Accepted
from gateway.edge.messages import ConversationKey, Inbound, Sender
from gateway.edge.metrics import Metrics
from gateway.edge.pairing import PairingStore
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from sessions.jsonl import JsonlSessionStore
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core


class CountingProvider(ScriptedProvider):
    """Echoes the last user text after a delay, tracking how many calls overlap."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay=delay)
        self.active = 0
        self.peak = 0

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay)
            last = request.messages[-1]["content"]
            return ProviderResponse(
                message={"role": "assistant", "content": [{"type": "text", "text": f"re:{last}"}]},
                stop_reason="end_turn")
        finally:
            self.active -= 1


async def test_per_conversation_order_and_cross_conversation_concurrency(tmp_path: Path) -> None:
    """Each chat's replies come in send order; chats run concurrently; idle chats hold no task."""
    provider = CountingProvider(delay=0.02)
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        for i in range(5):
            for chat in ("a", "b", "c"):
                await core.channel.say(chat, f"{chat}{i}")
        replies = await core.channel.wait_replies(15)
        await core.idle()  # raises TimeoutError if a worker task outlives its queue
    for chat in ("a", "b", "c"):
        assert [r[2] for r in replies if r[0] == chat] == [f"re:{chat}{i}" for i in range(5)]
    assert provider.peak == 3  # three conversations at once, never two turns of one
    assert core.router.queued == 0
    assert core.registry.held == 0  # nothing held for idle conversations


async def test_global_turn_cap(tmp_path: Path) -> None:
    """No more than max_concurrent_turns turns run at once."""
    from coordination.local import LocalConversations
    from gateway.agent.loop import AgentLoop
    from gateway.agent.recorder import SESSION_LOG
    from gateway.agent.tools import ToolRegistry
    from gateway.delivery.registry import ConversationRegistry
    from gateway.delivery.router import Router
    from gateway.persona.workspace import PersonaWorkspace
    from tests.fakes.memory_channel import MemoryChannel

    metrics = Metrics()
    provider = CountingProvider(delay=0.03)
    loop = AgentLoop(provider=provider, prompts=PersonaWorkspace(tmp_path / "p"),
                     tools=ToolRegistry(), recorder=SESSION_LOG, metrics=metrics)
    registry = ConversationRegistry(JsonlSessionStore(tmp_path / "d"), metrics)
    channel = MemoryChannel()
    async with Router(registry=registry, loop=loop, sink_for=channel.reply_sink, metrics=metrics,
                      max_concurrent_turns=2,
                      conversations=LocalConversations()) as router:
        await channel.start(router.deliver)
        for chat in range(6):
            await channel.say(f"c{chat}", "hi")
        await channel.wait_replies(6)
    await registry.aclose()
    assert provider.peak == 2


async def test_duplicate_platform_id_dropped_before_session(tmp_path: Path) -> None:
    """The same platform id delivered twice is recorded and answered once."""
    provider = ScriptedProvider()
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        first = await core.channel.say("a", "hello", platform_id="u1")
        second = await core.channel.say("a", "hello", platform_id="u1")
        await core.channel.wait_replies(1)
        await core.idle()  # every turn has ended: a second answer would be out by now
        assert first is not None
        assert first.session_id
        replay = await core.replay(first.session_id)
    assert second is not None
    assert second.duplicate
    assert len(core.channel.replies) == 1
    assert [m["content"] for m in replay.messages if m["role"] == "user"] == ["hello"]


async def test_new_command_starts_fresh_session(tmp_path: Path) -> None:
    """/new answers with a new session id; the next message lands in that session."""
    provider = ScriptedProvider()
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        first = await core.channel.say("a", "one")
        await core.channel.wait_replies(1)
        await core.channel.say("a", "/new")
        await core.channel.say("a", "two")
        replies = await core.channel.wait_replies(3)
        conv = core.registry.peek(ConversationKey("memory", "a"))
        assert conv is not None
        second = await core.replay(conv.session_id)
    assert first is not None
    assert second.session_id != first.session_id
    assert replies[1][2] == f"Started a new conversation (session {second.session_id})."
    assert [m["content"] for m in second.messages if m["role"] == "user"] == ["two"]
    sessions = sorted(p.stem for p in (tmp_path / "d" / "sessions").glob("*.jsonl"))
    assert sorted([first.session_id, second.session_id]) == sessions  # type: ignore[type-var]


async def test_new_command_applies_in_arrival_order_under_a_steady_stream(
        tmp_path: Path) -> None:
    """/new behind a running turn takes effect right after it, in arrival order: messages
    sent after it (while the stream goes on) land in the new session, not the old one."""
    provider = CountingProvider(delay=0.05)
    store = JsonlSessionStore(tmp_path / "d")
    async with running_core(store, provider, tmp_path / "p") as core:
        first = await core.channel.say("a", "one")  # its turn runs while the rest arrives
        delivered = asyncio.Event()
        later: list[Accepted | None] = []

        async def stream() -> None:
            # After /new is in (an old router held /new back until the queue ran dry, so the
            # stream goes on regardless after a moment, showing what that did).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.3):
                    await delivered.wait()
            for text in ("two", "three", "four"):
                later.append(await core.channel.say("a", text))
                await asyncio.sleep(0.02)  # a steady stream, each one during a running turn

        streaming = asyncio.create_task(stream())
        await core.channel.say("a", "/new")
        delivered.set()
        await streaming
        replies = await core.channel.wait_replies(5)
    assert first is not None
    texts = [r[2] for r in replies]
    new_session = texts[1].removeprefix("Started a new conversation (session ").rstrip(").")
    assert texts == ["re:one", f"Started a new conversation (session {new_session}).",
                     "re:two", "re:three", "re:four"]
    old = await core.replay(first.session_id or "")
    new = await core.replay(new_session)
    assert [m["content"] for m in old.messages if m["role"] == "user"] == ["one"]
    assert [m["content"] for m in new.messages if m["role"] == "user"] == [
        "two", "three", "four"]
    assert all(a is not None and a.session_id in (None, new_session) for a in later)


async def test_idle_rotation_starts_new_session_after_silence(tmp_path: Path) -> None:
    """With idle rotation on, a message after the idle period opens a new session."""
    now = [1_000_000.0]
    provider = ScriptedProvider()
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        core.registry.idle_rotate = 60
        core.registry.clock = lambda: now[0]
        first = await core.channel.say("a", "one")
        await core.channel.wait_replies(1)
        await core.idle()
        conv = core.registry.peek(ConversationKey("memory", "a"))
        assert conv is not None
        conv.last_active = now[0]
        now[0] += 30
        same = await core.channel.say("a", "two")
        await core.channel.wait_replies(2)
        await core.idle()
        conv.last_active = now[0]
        now[0] += 61
        rotated = await core.channel.say("a", "three")
        await core.channel.wait_replies(3)
    assert first is not None
    assert same is not None
    assert rotated is not None
    assert same.session_id == first.session_id
    assert rotated.session_id != first.session_id


async def test_access_gate_refuses_unknown_and_pairs(tmp_path: Path) -> None:
    """An unknown DM user gets a pairing code and no session; once approved, they get answers."""
    store = JsonlSessionStore(tmp_path / "d")
    operator = PairingStore(FilePairingState.under(tmp_path / "d"))  # as `gateway pairing`
    pairing = LivePairing(FilePairingState.under(tmp_path / "d"))
    policy = AccessPolicy(rules={"memory": ChannelRules(users=frozenset({"boss"}))},
                          pairing=pairing, unrestricted=frozenset())
    provider = ScriptedProvider()
    notices: list[tuple[str, str]] = []
    async with running_core(store, provider, tmp_path / "p") as core, pairing:

        async def notify(inbound: Inbound, text: str, sink: object) -> None:
            notices.append((inbound.sender.id, text))

        gate = AccessGate(policy, core.router.deliver, notify, core.metrics)

        def msg(sender: str, text: str, chat_type: str = "private") -> Inbound:
            return Inbound(key=ConversationKey("memory", sender), sender=Sender(sender),
                           text=text, chat_type=chat_type)

        refused: Any = await gate.deliver(msg("stranger", "hi"))
        group: Any = await gate.deliver(msg("stranger", "hi all", chat_type="group"))
        assert refused is None
        assert group is None
        assert not (tmp_path / "d" / "sessions").exists() or not list(
            (tmp_path / "d" / "sessions").glob("*.jsonl"))
        code = notices[0][1].split("approve ")[1].split()[0]
        operator.approve(code)  # the code was on record before it was told
        await gate.deliver(msg("stranger", "hi again"))
        await gate.deliver(msg("boss", "hello"))
        replies = await core.channel.wait_replies(2)
    assert len(notices) == 1
    assert len(code) == 8
    assert sorted(r[0] for r in replies) == ["boss", "stranger"]



def stranger_gate(tmp_path: Path, notices: list[tuple[str, str]],
                  **clock: Any) -> tuple[AccessGate, LivePairing]:
    """A gate with pairing on for every sender of the memory channel; the pairing replies go
    to ``notices`` as (sender, code); a message that passes fails the test."""
    pairing = LivePairing(FilePairingState.under(tmp_path / "d"))
    policy = AccessPolicy(rules={"memory": ChannelRules()}, pairing=pairing,
                          unrestricted=frozenset())

    async def notify(inbound: Inbound, text: str, sink: object) -> None:
        notices.append((inbound.sender.id, text.split("approve ")[1].split()[0]))

    async def deliver(inbound: Inbound, sink: object = None) -> object:
        raise AssertionError("a stranger's message reached the router")

    return AccessGate(policy, deliver, notify, Metrics(), **clock), pairing


def dm(sender: str) -> Inbound:
    return Inbound(key=ConversationKey("memory", sender), sender=Sender(sender), text="hi",
                   chat_type="private")


async def test_a_stranger_writing_again_and_again_gets_one_pairing_reply(
        tmp_path: Path) -> None:
    """Three messages from one stranger get one pairing reply; another stranger gets their
    own (the reply is per person, not one for all)."""
    notices: list[tuple[str, str]] = []
    gate, pairing = stranger_gate(tmp_path, notices)
    async with pairing:
        for sender in ("stranger", "stranger", "other", "stranger"):
            await gate.deliver(dm(sender))
    assert [who for who, _ in notices] == ["stranger", "other"]


async def test_the_pairing_reply_comes_again_once_its_window_has_passed(
        tmp_path: Path) -> None:
    """A second before the window ends the stranger is still not answered; at its end the
    next message gets the pairing text again, with the same code (a fake clock)."""
    notices: list[tuple[str, str]] = []
    now = [1000.0]
    gate, pairing = stranger_gate(tmp_path, notices, clock=lambda: now[0])
    async with pairing:
        await gate.deliver(dm("stranger"))
        now[0] += PAIRING_REPLY_WINDOW - 1
        await gate.deliver(dm("stranger"))
        told_within = len(notices)
        now[0] += 1
        await gate.deliver(dm("stranger"))
    assert told_within == 1
    assert notices == [notices[0]] * 2


async def test_a_stop_ends_an_adopter_that_lost_its_cancellation(tmp_path: Path) -> None:
    """On Python 3.11 a cancellation that lands as a Redis command of the sweep completes is
    lost (``asyncio.wait_for``, CPython gh-86296), and the adopter sweeps on: the stop cancels
    it again until it has ended (seen as a worker that never stopped, under load)."""
    from collections.abc import AsyncIterator

    from coordination.local import LocalConversations
    from gateway.agent.loop import AgentLoop
    from gateway.agent.recorder import SESSION_LOG
    from gateway.agent.tools import ToolRegistry
    from gateway.delivery.registry import ConversationRegistry
    from gateway.delivery.router import Router
    from gateway.edge.coordination import Claim
    from gateway.persona.workspace import PersonaWorkspace
    from tests.fakes.memory_channel import MemoryChannel
    from tests.waiting import WAIT

    sweeping = asyncio.Event()
    lost: list[int] = []

    class Sweeping(LocalConversations):
        async def adoptions(self) -> AsyncIterator[Claim]:
            while True:  # as the Redis queue's sweep: one look every so often, for ever
                sweeping.set()
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    if lost:
                        raise
                    lost.append(1)  # the first one, as a lost cancellation: no error at all
                    current = asyncio.current_task()
                    assert current is not None
                    current.uncancel()
            yield Claim(ConversationKey("memory", "never"))  # pragma: no cover

    metrics = Metrics()
    loop = AgentLoop(provider=ScriptedProvider(), prompts=PersonaWorkspace(tmp_path / "p"),
                     tools=ToolRegistry(), recorder=SESSION_LOG, metrics=metrics)
    registry = ConversationRegistry(JsonlSessionStore(tmp_path / "d"), metrics)
    channel = MemoryChannel()
    async with asyncio.timeout(WAIT):
        async with Router(registry=registry, loop=loop, sink_for=channel.reply_sink,
                          metrics=metrics, conversations=Sweeping()) as router:
            await channel.start(router.deliver)
            await sweeping.wait()
            await router.drain(0)
    await registry.aclose()
    assert lost == [1]
