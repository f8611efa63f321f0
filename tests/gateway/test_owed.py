"""Owed answers survive the process (one gateway): what was acknowledged and not answered
when it stopped is answered on the next start, once, in conversation order, from how far
the session log shows it got."""

from __future__ import annotations

import asyncio
from pathlib import Path

from coordination.journal import FileJournal
from coordination.keys import encode_item, member
from coordination.local import LocalConversations
from gateway.edge.coordination import Claim, QueueItem
from gateway.edge.messages import ConversationKey, Inbound, Sender
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from sessions.jsonl import JsonlSessionStore
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core
from tests.waiting import WAIT, until

KEY = ConversationKey("memory", "a")


class Echo(ScriptedProvider):
    """``re:<last user text>``; with ``hold`` set, every call waits until it is cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: asyncio.Event | None = None
        self.calls: list[str] = []

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        last = str(request.messages[-1]["content"])
        self.calls.append(last)
        if self.hold is not None:
            await self.hold.wait()
        return ProviderResponse(message={"role": "assistant",
                                         "content": [{"type": "text", "text": f"re:{last}"}]},
                                stop_reason="end_turn")


def queue(tmp_path: Path) -> LocalConversations:
    return LocalConversations(FileJournal(tmp_path / "d" / "state" / "delivery.jsonl"))


async def test_queued_and_interrupted_messages_are_answered_after_a_restart(
        tmp_path: Path) -> None:
    """Stopped mid-call with two more queued: the next start finishes the cut turn (asking the
    provider again, recording the message once) and answers the queued ones in order."""
    store = JsonlSessionStore(tmp_path / "d")
    provider = Echo()
    provider.hold = asyncio.Event()  # the first run never gets an answer
    async with running_core(store, provider, tmp_path / "p",
                            conversations=queue(tmp_path)) as core:
        first = await core.channel.say("a", "one")
        await core.channel.say("a", "two")
        await core.channel.say("a", "three")
        await until(lambda: provider.calls)
        await core.router.drain(0)  # stopped: the turn is cut off, nothing else runs
    assert core.channel.replies == []
    provider.hold = None
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            conversations=queue(tmp_path)) as again:
        replies = await again.channel.wait_replies(3)
        await again.idle()
        assert first is not None
        replay = await again.replay(first.session_id or "")
    assert [r[2] for r in replies] == ["re:one", "re:two", "re:three"]
    assert provider.calls == ["one", "one", "two", "three"]  # the cut call, asked again
    users = [m["content"] for m in replay.messages if m["role"] == "user"]
    assert users == ["one", "two", "three"]
    assert [m["content"][0]["text"] for m in replay.messages if m["role"] == "assistant"] == [
        "re:one", "re:two", "re:three"]
    journal = FileJournal(tmp_path / "d" / "state" / "delivery.jsonl")
    await journal.open()
    assert journal.owed() == []  # nothing is owed any more
    journal.close()


async def test_an_answer_recorded_but_not_marked_is_sent_again_without_a_new_call(
        tmp_path: Path) -> None:
    """Stopped between recording the answer and noting it was sent: the next start sends the
    recorded answer (no provider call, nothing recorded again)."""
    store = JsonlSessionStore(tmp_path / "d")
    provider = Echo()
    async with running_core(store, provider, tmp_path / "p",
                            conversations=queue(tmp_path)) as core:

        async def stop_before_done(*_: object) -> None:
            raise asyncio.CancelledError  # the process ends right after the reply went out

        core.router.conversations.done = stop_before_done  # type: ignore[method-assign]
        first = await core.channel.say("a", "one")
        await core.channel.wait_replies(1)
        await core.idle()
    assert first is not None
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            conversations=queue(tmp_path)) as again:
        replies = await again.channel.wait_replies(1)
        await again.idle()
        replay = await again.replay(first.session_id or "")
    assert replies == [("a", "finish", "re:one")]
    assert provider.calls == ["one"]
    assert [m["role"] for m in replay.messages] == ["user", "assistant"]


async def test_a_message_owed_but_never_written_to_its_session_is_recorded_once(
        tmp_path: Path) -> None:
    """Killed between the journal's line and the session append: the next start records the
    message from the journal and answers it."""
    journal = FileJournal(tmp_path / "d" / "state" / "delivery.jsonl")
    await journal.open()
    item = QueueItem(Inbound(KEY, Sender("u", "U"), "lost in between", platform_id="p1"))
    await journal.owe(item.id, member(KEY), f"default:{KEY.label()}:p1", encode_item(item, ""))
    journal.close()
    provider = Echo()
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            conversations=queue(tmp_path)) as core:
        replies = await core.channel.wait_replies(1)
        await core.idle()
        duplicate = await core.channel.say("a", "lost in between", platform_id="p1")
        conv = core.registry.peek(KEY)
        assert conv is not None
        replay = await core.replay(conv.session_id)
    assert replies == [("a", "finish", "re:lost in between")]
    assert duplicate is not None
    assert duplicate.duplicate  # the platform's redelivery is recognised
    assert [m["content"] for m in replay.messages if m["role"] == "user"] == ["lost in between"]
    assert replay.messages.entry(0)["meta"]["item"] == item.id


async def test_a_restart_serves_owed_messages_in_the_order_they_were_queued(
        tmp_path: Path) -> None:
    """Two messages owed A then B but queued B then A (A's recording awaited its session
    longer, as concurrent deliveries do): after a restart the conversation serves B, then A,
    as it would have live; a message owed but never queued comes last. (A crash-kill trial
    found the owed order served instead: a later message ran inside an interrupted turn.)"""
    def message(text: str) -> QueueItem:
        return QueueItem(Inbound(KEY, Sender("u", "U"), text, platform_id=text))

    a, b, c = message("a"), message("b"), message("c")
    live = queue(tmp_path)
    await live.open()
    for item in (a, b, c):
        assert not (await live.enter(item, f"k-{item.inbound.text}")).duplicate
    assert await live.keep(b) is not None  # B's claim: it starts the conversation's worker
    assert await live.keep(a) is None  # A joins behind B; C is never queued (the stop)
    await live.aclose()

    path = tmp_path / "d" / "state" / "delivery.jsonl"
    for _ in range(2):  # twice: the first open rewrites the file, the second reads that
        journal = FileJournal(path)
        await journal.open()
        assert [o.id for o in journal.owed()] == [b.id, a.id, c.id]
        journal.close()
    again = queue(tmp_path)
    await again.open()
    claims = [claim async for claim in again.adoptions()]
    assert [claim.key for claim in claims] == [KEY]
    served = []
    while (item := await again.next(claims[0])) is not None:
        served.append(item.inbound.text)
        await again.done(claims[0], item)
    assert served == ["b", "a", "c"]
    await again.aclose()


class SlowKeep(LocalConversations):
    """Queues an item only once ``gate`` is set (``entered`` says one is waiting): a message
    still being received when the gateway begins to stop."""

    def __init__(self, journal: FileJournal) -> None:
        super().__init__(journal)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def keep(self, item: QueueItem) -> Claim | None:
        self.entered.set()
        await self.gate.wait()
        return await super().keep(item)


async def test_a_message_received_during_the_drain_is_answered_after_the_next_start(
        tmp_path: Path) -> None:
    """A message whose receiving began before the stop and ended during it is recorded and
    owed, but no turn starts for it in the stopping process (it would outlive the drain and
    its answer could not be noted, so it would be sent again): the next start answers it,
    once. (A crash-kill trial's clean stop found it answered twice.)"""
    provider = Echo()
    journal = FileJournal(tmp_path / "d" / "state" / "delivery.jsonl")
    slow = SlowKeep(journal)
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            conversations=slow) as core:
        saying = asyncio.create_task(core.channel.say("a", "one"))
        await asyncio.wait_for(slow.entered.wait(), WAIT)
        await core.router.drain(0)  # the stop begins while the message is being received
        slow.gate.set()
        accepted = await asyncio.wait_for(saying, 5)
        await core.idle()
        assert accepted is not None
        assert accepted.session_id is not None  # recorded: the platform hears "received"
        assert provider.calls == []
        assert core.channel.replies == []
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            conversations=queue(tmp_path)) as again:
        replies = await again.channel.wait_replies(1)
        await again.idle()
    assert [r[2] for r in replies] == ["re:one"]
    assert provider.calls == ["one"]


async def test_an_item_owed_but_never_queued_keeps_its_place_across_two_restarts(
        tmp_path: Path) -> None:
    """A run owes A and dies before queuing it; the next run queues A (resumed) and then
    receives B; it dies too. The third run serves A before B (a crash-kill trial found B served
    first: the resumed A was never noted as queued)."""
    def message(text: str) -> QueueItem:
        return QueueItem(Inbound(KEY, Sender("u", "U"), text, platform_id=text))

    a, b = message("a"), message("b")
    first = queue(tmp_path)
    await first.open()
    assert not (await first.enter(a, "k-a")).duplicate  # owed, then the process dies
    await first.aclose()

    second = queue(tmp_path)
    await second.open()  # A comes back resumed, queued first
    assert not (await second.enter(b, "k-b")).duplicate
    assert await second.keep(b) is None  # behind A
    await second.aclose()

    third = queue(tmp_path)
    await third.open()
    claims = [claim async for claim in third.adoptions()]
    served = []
    while (item := await third.next(claims[0])) is not None:
        served.append(item.inbound.text)
        await third.done(claims[0], item)
    assert served == ["a", "b"]
    await third.aclose()
