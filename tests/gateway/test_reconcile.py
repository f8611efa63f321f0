"""Answers are reconciled with the platform, not sent again: a restart that finds where an
answer went (the ``delivery`` entry noted before its text went in) finishes it by editing that
message; notices, budget refusals and apologies are recorded before they go out, so a
restart knows they did.

The "kill" here is a journal that cannot note an item answered (its ``paid`` line is refused
by the disk seam, as if the process died right after the reply went out); the platform's
messages are the memory channel's, kept across the two runs.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson

from app.commands.replay import print_summary
from coordination.journal import FileJournal
from coordination.local import LocalConversations
from coordination.memory_ledger import MemoryLedger
from gateway.edge.messages import Attachment
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from gateway.media.policy import MediaLimits
from gateway.usage.limits import LimitSettings
from sessions.blob_files import FileBlobStore
from sessions.jsonl import JsonlSessionStore
from sessions.replay import replay_bytes
from tests.fakes import media
from tests.fakes.memory_channel import MemoryChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import Core, running_core
from tests.waiting import WAIT

NOON = 1_796_126_400.0  # 2026-12-01T12:00:00Z


class Echo(ScriptedProvider):
    """``re:<last user text>``, streamed as one delta first; with ``hold`` set, every call
    waits after that delta until it is cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: asyncio.Event | None = None
        self.calls: list[str] = []
        self.streaming = asyncio.Event()

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        last = str(request.messages[-1]["content"])
        self.calls.append(last)
        if on_text is not None:
            await on_text("re:")
        self.streaming.set()
        if self.hold is not None:
            await self.hold.wait()
        return ProviderResponse(message={"role": "assistant",
                                         "content": [{"type": "text", "text": f"re:{last}"}]},
                                stop_reason="end_turn")


def refuse_paid(fd: int, data: memoryview) -> int:
    """The journal's disk, with no room for a note of an answer sent (every other line
    goes in)."""
    if b'["paid"' in bytes(data):
        raise OSError(28, "No space left on device")
    return os.write(fd, data)


@asynccontextmanager
async def run(tmp_path: Path, channel: MemoryChannel, provider: ScriptedProvider, *,
              noting: bool = True, **options: object) -> AsyncIterator[Core]:
    """One run of the core on ``tmp_path``'s data, with ``channel`` (its platform messages
    kept across runs); ``noting=False``: the journal cannot note answers (see
    :func:`refuse_paid`), so the next run finds the item owed."""
    journal = FileJournal(tmp_path / "d" / "state" / "delivery.jsonl",
                          **({} if noting else {"write_file": refuse_paid}))
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            conversations=LocalConversations(journal), channel=channel,
                            **options) as core:  # type: ignore[arg-type]
        yield core


def restarted(channel: MemoryChannel) -> MemoryChannel:
    """The same platform (its messages) seen by the next run's channel."""
    again = MemoryChannel(placing=True)
    again.messages = channel.messages
    again.message_ids = channel.message_ids
    return again


def kinds(channel: MemoryChannel) -> list[tuple[str, str]]:
    return [(kind, text) for _, kind, text in channel.events
            if kind in ("placeholder", "edit")]


async def log_of(core: Core, session: str) -> list[dict[str, object]]:
    data = await core.store.read_log("default", session)
    return [orjson.loads(line) for line in data.splitlines()]


async def test_an_answer_sent_but_not_noted_is_finished_by_editing_its_message(
        tmp_path: Path) -> None:
    """Killed after the answer went into its noted message, before the item was marked
    answered: the next start edits that same message to the recorded answer (no new message,
    no provider call), and the log says where it went."""
    provider = Echo()
    first = MemoryChannel(placing=True)
    async with run(tmp_path, first, provider, noting=False) as core:
        accepted = await core.channel.say("a", "one")
        await core.channel.wait_replies(1)
        await core.idle()
    assert kinds(first) == [("placeholder", "1"), ("edit", "1:re:one")]
    again = restarted(first)
    async with run(tmp_path, again, provider) as core:
        await again.wait_replies(1)
        await core.idle()
        assert accepted is not None
        entries = await log_of(core, accepted.session_id or "")
    assert kinds(again) == [("edit", "1:re:one")]
    assert first.messages == {1: "re:one"}
    assert provider.calls == ["one"]
    # Noted once, by the first run, before the answer went into the message.
    assert [(e["message"], e["part"], e["ref"]) for e in entries
            if e["type"] == "delivery"] == [(0, 0, {"message": 1})]


async def test_a_turn_cut_off_after_its_preview_is_finished_in_that_message(
        tmp_path: Path) -> None:
    """Stopped while the answer streamed into its (noted) message: the next start runs the
    turn again and finishes the answer in that message, never in a second one."""
    provider = Echo()
    provider.hold = asyncio.Event()
    first = MemoryChannel(placing=True)
    async with run(tmp_path, first, provider) as core:
        await core.channel.say("a", "one")
        await asyncio.wait_for(provider.streaming.wait(), WAIT)
        await core.router.drain(0)
    assert kinds(first) == [("placeholder", "1")]
    provider.hold = None
    again = restarted(first)
    async with run(tmp_path, again, provider) as core:
        await again.wait_replies(1)
        await core.idle()
    assert kinds(again) == [("edit", "1:re:one")]
    assert first.messages == {1: "re:one"}
    assert provider.calls == ["one", "one"]  # the cut call, asked again


async def test_a_message_deleted_meanwhile_is_replaced_by_a_new_noted_one(
        tmp_path: Path) -> None:
    """The noted message is gone by the next start (the person deleted it): the answer goes
    into a new placeholder, noted the same way."""
    provider = Echo()
    first = MemoryChannel(placing=True)
    async with run(tmp_path, first, provider, noting=False) as core:
        accepted = await core.channel.say("a", "one")
        await core.channel.wait_replies(1)
        await core.idle()
    del first.messages[1]
    again = restarted(first)
    async with run(tmp_path, again, provider) as core:
        await again.wait_replies(1)
        await core.idle()
        assert accepted is not None
        entries = await log_of(core, accepted.session_id or "")
    assert kinds(again) == [("placeholder", "2"), ("edit", "2:re:one")]
    assert [e["ref"] for e in entries if e["type"] == "delivery"] == [
        {"message": 1}, {"message": 2}]


async def test_a_refused_file_notice_survives_a_kill_without_being_sent_twice(
        tmp_path: Path) -> None:
    """Every file refused and no text: the notice is recorded (a ``reply`` entry) before it
    goes out; killed before the item was marked answered, the next start puts the recorded
    notice into the same message, and no provider call is made either time."""
    provider = Echo()
    first = MemoryChannel(placing=True)
    blobs = FileBlobStore(tmp_path / "d")
    limits = MediaLimits(max_bytes=1000)
    async with run(tmp_path, first, provider, noting=False, blobs=blobs,
                   limits=limits) as core:
        accepted = await core.channel.say("a", "", attachments=(
            Attachment("scan.pdf", "application/pdf", media.PDF * 20),))
        [(_, _, notice)] = await core.channel.wait_replies(1)
        await core.idle()
    assert notice.startswith("I couldn't use scan.pdf")
    again = restarted(first)
    async with run(tmp_path, again, provider, blobs=blobs, limits=limits) as core:
        await again.wait_replies(1)
        await core.idle()
        assert accepted is not None
        entries = await log_of(core, accepted.session_id or "")
    assert kinds(first)[-1:] == kinds(again) == [("edit", f"1:{notice}")]
    assert first.messages == {1: notice}
    assert provider.calls == []
    assert [(e["kind"], e["text"]) for e in entries if e["type"] == "reply"] == [
        ("notice", notice)]


async def test_a_budget_refusal_survives_a_kill_without_being_sent_twice(
        tmp_path: Path) -> None:
    """Refused by a budget: the refusal entry names the message and holds the sentence;
    killed before the item was marked answered, the next start puts that sentence into the
    same message without asking the limits (or the provider) again."""
    provider = ScriptedProvider()  # its answers count tokens, which use the budget up
    provider.script("re:hello")
    ledger = MemoryLedger()
    budgets = LimitSettings(user_tokens=1)
    first = MemoryChannel(placing=True)
    async with run(tmp_path, first, provider, ledger=ledger, budgets=budgets,
                   clock=lambda: NOON) as core:
        await core.channel.say("a", "hello")
        await core.channel.wait_replies(1)
        await core.idle()
    async with run(tmp_path, first, provider, noting=False, ledger=ledger, budgets=budgets,
                   clock=lambda: NOON) as core:
        accepted = await core.channel.say("a", "and again")
        replies = await core.channel.wait_replies(2)
        await core.idle()
    refusal = replies[1][2]
    assert refusal.startswith("You've used up today's allowance")
    again = restarted(first)
    # A new ledger: were the limits asked again, this run would let the message through.
    async with run(tmp_path, again, provider, ledger=MemoryLedger(), budgets=budgets,
                   clock=lambda: NOON) as core:
        await again.wait_replies(1)
        await core.idle()
        assert accepted is not None
        data = await core.store.read_log("default", accepted.session_id or "")
    assert kinds(again) == [("edit", f"2:{refusal}")]
    assert first.messages == {1: "re:hello", 2: refusal}
    assert len(provider.requests) == 1
    [refused] = replay_bytes(data).refusals
    assert refused.limit == "user_budget"


async def test_an_apology_survives_a_kill_without_being_sent_twice(tmp_path: Path) -> None:
    """The provider failed and the person got the apology (recorded first, a ``reply``
    entry); killed before the item was marked answered, the next start puts the recorded
    apology into the same message instead of running the turn again."""
    provider = ScriptedProvider()
    provider.script(RuntimeError("the model fell over"))
    first = MemoryChannel(placing=True)
    async with run(tmp_path, first, provider, noting=False) as core:
        accepted = await core.channel.say("a", "one")
        [(_, kind, apology)] = await core.channel.wait_replies(1)
        await core.idle()
    assert kind == "fail"
    again = restarted(first)
    async with run(tmp_path, again, provider) as core:
        [(_, kind_again, _)] = await again.wait_replies(1)
        await core.idle()
        assert accepted is not None
        entries = await log_of(core, accepted.session_id or "")
    assert kind_again == "fail"
    assert kinds(again) == [("edit", f"1:{apology}")]
    assert len(provider.requests) == 1
    assert [e["kind"] for e in entries if e["type"] == "reply"] == ["apology"]
    # Replay shows the apology and where the answer went.
    replay = replay_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))
    assert [(r.kind, r.message, r.text) for r in replay.replies] == [("apology", 0, apology)]
    assert [(d.message, d.part, dict(d.ref)) for d in replay.deliveries] == [
        (0, 0, {"message": 1})]
    out = io.StringIO()
    print_summary(replay, out)
    assert "message 0 got an apology, no model answer" in out.getvalue()
    assert "delivered: 1 platform message(s)" in out.getvalue()
