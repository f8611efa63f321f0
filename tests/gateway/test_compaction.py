"""Compaction: a long history is summarised by recorded calls; later calls send the summary in
its place, fit the window, survive a restart, and replay byte-equal."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.agent.compaction import INSTRUCTIONS, SUMMARY_HEADER
from gateway.agent.window import estimate_tokens
from gateway.edge.errors import ProviderUnavailable
from gateway.edge.provider import ProviderRequest
from sessions.jsonl import JsonlSessionStore
from sessions.replay import Call, Replay
from sessions.scan import message_text
from tests.fakes.scripted_provider import Reply, ScriptedProvider
from tests.gateway.harness import Core, running_core

WINDOW = 400
FILLER = "lorem ipsum dolor sit amet " * 8  # about 55 tokens a message


def summarising(request: ProviderRequest) -> Reply:
    """Summaries name the user messages they saw; other calls answer briefly."""
    if request.system == INSTRUCTIONS:
        seen = [message_text(m["content"]) or "" for m in request.messages
                if m["role"] == "user"]
        heads = [s.split(":")[0] for s in seen if s.startswith(("message", SUMMARY_HEADER))]
        return "covered: " + "; ".join(h.replace(SUMMARY_HEADER, "summary ") for h in heads)
    return "noted"


def compactions(replay: Replay) -> list[Call]:
    return [t for t in replay.calls if t.lineage is not None and t.lineage.reason == "compaction"]


async def chat(core: Core, count: int, start: int = 0) -> str:
    accepted = None
    for n in range(start, start + count):
        accepted = await core.channel.say("c1", f"message {n}: {FILLER}")
        await core.channel.wait_replies(n + 1)
    assert accepted is not None
    assert accepted.session_id
    return accepted.session_id


def assert_replays(replay: Replay, provider: ScriptedProvider) -> None:
    """Every body the provider received is the one replay rebuilds for its call."""
    assert [replay.request(t) for t in replay.calls] == provider.bodies


async def test_long_history_is_summarised_and_every_call_fits_and_replays(
    tmp_path: Path,
) -> None:
    """20 turns through a 400-token window: compaction calls are recorded with what they
    replace, every later call sends the latest summary first, and every body replays."""
    provider = ScriptedProvider(responder=summarising)
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            window_tokens=WINDOW) as core:
        session = await chat(core, 20)
        replay = await core.replay(session)
    summaries = compactions(replay)
    assert len(summaries) >= 2
    assert_replays(replay, provider)
    for number, turn in enumerate(replay.calls):
        request = provider.requests[number]
        lineage = turn.lineage
        if lineage is not None and lineage.reason == "compaction":
            outcome = replay.outcome_of(turn)
            assert outcome is not None
            assert outcome.answer is not None
            assert turn.assistant is None  # the summary is not a conversation message
            continue
        # Every ordinary call fits the window: its messages, summary included.
        assert sum(estimate_tokens(m) for m in request.messages) <= WINDOW
        if lineage is None or lineage.summary is None:
            assert not summaries or turn.index < summaries[0].index
            continue
        # It sends the latest summary written before it, as message 0.
        source = replay.call(lineage.summary + 1)
        assert source in summaries
        assert source.index < turn.index
        assert lineage.replaces == source.lineage.replaces  # type: ignore[union-attr]
        answer = replay.outcome_of(source).answer  # type: ignore[union-attr]
        assert request.messages[0] == {
            "role": "user", "content": SUMMARY_HEADER + message_text(answer["content"])}
    # Each later summary also summarises the one before it, and replaces a longer prefix.
    first, second = summaries[0], summaries[1]
    assert first.lineage is not None
    assert second.lineage is not None
    assert first.lineage.replaces[0][0] == 0
    assert second.lineage.replaces[0] == (0, second.lineage.replaces[0][1])
    assert second.lineage.replaces[-1][1] > first.lineage.replaces[-1][1]
    second_request = provider.requests[second.index - 1]
    assert message_text(second_request.messages[0]["content"]).startswith(SUMMARY_HEADER)
    assert second_request.messages[-1]["content"].startswith("Summarise the conversation")


async def test_turned_off_the_oldest_messages_fall_out(tmp_path: Path) -> None:
    """GATEWAY_COMPACTION=false: no compaction call; windows drop the oldest messages."""
    provider = ScriptedProvider(responder=summarising)
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            window_tokens=WINDOW, compaction=False) as core:
        session = await chat(core, 12)
        replay = await core.replay(session)
    assert compactions(replay) == []
    assert len(replay.calls) == 12
    first_sent = message_text(provider.requests[-1].messages[0]["content"]) or ""
    assert not first_sent.startswith(("message 0:", SUMMARY_HEADER))
    assert_replays(replay, provider)


async def test_a_restart_keeps_sending_the_summary(tmp_path: Path) -> None:
    """After a restart the resumed conversation sends the logged summary, with no new
    compaction call until the history overflows again."""
    store_dir = tmp_path / "d"
    provider = ScriptedProvider(responder=summarising)
    async with running_core(JsonlSessionStore(store_dir), provider, tmp_path / "p",
                            window_tokens=WINDOW) as core:
        session = await chat(core, 12)
        before = await core.replay(session)
    latest = compactions(before)[-1]
    again = ScriptedProvider(responder=summarising)
    async with running_core(JsonlSessionStore(store_dir), again, tmp_path / "p",
                            window_tokens=WINDOW) as core:
        await core.channel.say("c1", "one more")
        await core.channel.wait_replies(1)
        after = await core.replay(session)
    assert len(after.calls) == len(before.calls) + 1
    resumed = after.calls[-1]
    assert resumed.lineage is not None
    assert resumed.lineage.summary == latest.entry_number
    assert message_text(again.requests[0].messages[0]["content"]).startswith(SUMMARY_HEADER)
    assert [after.request(t) for t in after.calls[len(before.calls):]] == again.bodies


async def test_a_failed_compaction_leaves_the_window_to_drop_messages(tmp_path: Path) -> None:
    """The compaction call fails: it is recorded with its error, and the turn is answered
    with a window that leaves the oldest messages out."""
    failures: list[str] = []

    def flaky(request: ProviderRequest) -> Reply:
        if request.system == INSTRUCTIONS:
            failures.append("compaction")
            return ProviderUnavailable("scripted: HTTP 529 overloaded_error", status=529)
        return "noted"

    provider = ScriptedProvider(responder=flaky)
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            window_tokens=WINDOW) as core:
        session = await chat(core, 10)
        replay = await core.replay(session)
    assert failures
    failed = compactions(replay)
    assert failed
    outcomes = [replay.outcome_of(t) for t in failed]
    assert all(o is not None and o.error and o.error["kind"] == "unavailable" for o in outcomes)
    answered = [t for t in replay.calls if t.lineage is None or t.lineage.reason is None]
    assert len(answered) == 10
    assert all(t.assistant is not None for t in answered)
    assert_replays(replay, provider)


@pytest.mark.parametrize("window", [120, 300])
async def test_one_message_bigger_than_the_window(tmp_path: Path, window: int) -> None:
    """Nothing can be summarised to make room: no compaction call, the turn is answered."""
    provider = ScriptedProvider(responder=summarising)
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            window_tokens=window) as core:
        accepted = await core.channel.say("c1", "x " * 4000)
        replies = await core.channel.wait_replies(1)
        assert accepted is not None
        replay = await core.replay(accepted.session_id or "")
    assert replies[0][1:] == ("finish", "noted")
    assert compactions(replay) == []

