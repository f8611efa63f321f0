"""The agent loop end to end over a memory channel, a scripted provider and the JSONL store."""

from __future__ import annotations

import asyncio
import errno
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from coordination.keys import decode_item
from coordination.local import LocalConversations
from gateway.edge.errors import ProviderRateLimited, UnavailableError
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from sessions import traces
from sessions.encoding import dumps
from sessions.jsonl import JsonlSessionStore
from sessions.replay import NotRebuildableError, Replay
from tests.fakes.observer import RecordingObserver
from tests.fakes.providers import content_text, system_text
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.store import Fault, FaultyStore, Refuse
from tests.gateway.harness import running_core
from tests.waiting import WAIT, until


def tool_use(name: str, args: dict[str, Any], id_: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "text", "text": "one moment"},
        {"type": "tool_use", "id": id_, "name": name, "input": args},
    ]}


def assert_replay_equals(replay: Replay, bodies: list[dict[str, Any]]) -> None:
    assert len(replay.calls) == len(bodies)
    for turn, body in zip(replay.calls, bodies, strict=True):
        assert replay.request(turn, "anthropic") == body


async def test_every_call_replays_to_the_body_the_provider_received(tmp_path: Path) -> None:
    """A conversation with a tool round replays, call for call, to what the provider got."""
    provider = ScriptedProvider()
    provider.script("hello!", tool_use("memory_write", {"text": "likes tea"}, "t1"), "noted")
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        accepted = await core.channel.say("c1", "hi")
        await core.channel.wait_replies(1)
        await core.channel.say("c1", "remember that I like tea")
        replies = await core.channel.wait_replies(2)
        assert accepted is not None
        assert accepted.session_id
        replay = await core.replay(accepted.session_id)
    assert [r[1:] for r in replies] == [("finish", "hello!"), ("finish", "one moment\n\nnoted")]
    assert_replay_equals(replay, provider.bodies)
    assert len(replay.calls) == 3


async def test_tool_edit_rebuilds_prompt_for_next_call_in_same_turn(tmp_path: Path) -> None:
    """After memory_write, the very next call of the same turn carries the rebuilt prompt."""
    provider = ScriptedProvider()
    provider.script(tool_use("memory_write", {"text": "Ada prefers short answers"}, "t1"), "ok")
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        accepted = await core.channel.say("c1", "remember I like short answers")
        await core.channel.wait_replies(1)
        assert accepted is not None
        assert accepted.session_id
        replay = await core.replay(accepted.session_id)
    assert "Ada prefers short answers" not in system_text(provider.bodies[0])
    assert "Ada prefers short answers" in system_text(provider.bodies[1])
    assert [(p.reason, p.first_call) for p in replay.prompts] == [
        ("initial", 1), ("rebuilt:memory_write", 2)
    ]
    assert_replay_equals(replay, provider.bodies)


async def test_operator_file_edit_is_picked_up(tmp_path: Path) -> None:
    """An edit to MEMORY.md made while running shows up as rebuilt:file_changed."""
    provider = ScriptedProvider()
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        accepted = await core.channel.say("c1", "one")
        await core.channel.wait_replies(1)
        memory = tmp_path / "p" / "MEMORY.md"
        memory.write_text("- the operator added this\n")
        await core.channel.say("c1", "two")
        await core.channel.wait_replies(2)
        assert accepted is not None
        assert accepted.session_id
        replay = await core.replay(accepted.session_id)
    assert [p.reason for p in replay.prompts] == ["initial", "rebuilt:file_changed"]
    assert "the operator added this" in system_text(provider.bodies[1])
    assert_replay_equals(replay, provider.bodies)


async def test_small_budget_window_drops_old_messages_and_replays(tmp_path: Path) -> None:
    """With a small token budget old messages leave the window; replay shows the same window."""
    provider = ScriptedProvider()
    store = JsonlSessionStore(tmp_path / "d")
    async with running_core(store, provider, tmp_path / "p", window_tokens=80) as core:
        for i in range(6):
            accepted = await core.channel.say("c1", f"message {i} " + "x" * 60)
            await core.channel.wait_replies(i + 1)
        assert accepted is not None
        assert accepted.session_id
        replay = await core.replay(accepted.session_id)
    last = replay.calls[-1]
    assert last.window is not None
    assert last.window[0][0] > 0
    assert provider.bodies[-1]["messages"][0]["content"].startswith("message ")
    assert_replay_equals(replay, provider.bodies)


class FirstCallHeld(ScriptedProvider):
    """The scripted provider whose first call waits for ``gate`` (``called`` says it began)."""

    def __init__(self) -> None:
        super().__init__()
        self.called = asyncio.Event()
        self.gate = asyncio.Event()

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        if not self.called.is_set():
            self.called.set()
            await self.gate.wait()
        return await super().complete(request, on_text)


async def test_message_during_tool_round_waits_and_windows_stay_exact(tmp_path: Path) -> None:
    """A message that arrives mid-turn is logged at once, answered next, windows stay exact."""
    provider = FirstCallHeld()
    provider.script(tool_use("mood_set", {"mood": "cheerful"}, "t1"), "first answer",
                    "second answer")
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        first = await core.channel.say("c1", "be cheerful")
        async with asyncio.timeout(WAIT):
            await provider.called.wait()  # the first call is in flight, held there
        await core.channel.say("c1", "and another thing")
        provider.gate.set()
        replies = await core.channel.wait_replies(2)
        assert first is not None
        assert first.session_id
        replay = await core.replay(first.session_id)
    assert [r[2] for r in replies] == ["one moment\n\nfirst answer", "second answer"]
    roles = [[m["role"] for m in b["messages"]] for b in provider.bodies]
    assert roles == [["user"], ["user", "assistant", "user"],
                     ["user", "assistant", "user", "assistant", "user"]]
    assert content_text(provider.bodies[2]["messages"][-1]["content"]) == "and another thing"
    assert_replay_equals(replay, provider.bodies)


async def test_provider_error_ends_with_apology_and_outcome(tmp_path: Path) -> None:
    """A 429 after retries gives the user an apology and the log an outcome with the error."""
    provider = ScriptedProvider()
    provider.script(ProviderRateLimited("slow down", status=429))
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        accepted = await core.channel.say("c1", "hi")
        replies = await core.channel.wait_replies(1)
        assert accepted is not None
        assert accepted.session_id
        replay = await core.replay(accepted.session_id)
    assert replies[0][1] == "fail"
    turn = replay.calls[0]
    assert turn.assistant is None
    outcome = replay.outcome_of(turn)
    assert outcome is not None
    assert outcome.error is not None
    assert outcome.error["kind"] == "rate_limited"


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "ENOSPC"),
        (PermissionError(errno.EACCES, "Permission denied"), "EACCES"),
        ("hang", "timeout"),
    ],
)
async def test_persist_failure_still_answers_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: Fault, kind: str
) -> None:
    """A failed or hung persist write is logged once, counted, the user answered, and the call
    (accepted, then written ahead of the next append) still replays exactly."""
    store = FaultyStore()
    provider = ScriptedProvider()
    provider.script("answer one")
    async with running_core(store, provider, tmp_path / "p", persist_timeout=0.2) as core:
        store.set_fault(fault, {"call"})  # only the persist step's batch fails
        with caplog.at_level(logging.WARNING, logger="gateway.agent.recorder"):
            accepted = await core.channel.say("c1", "hi")
            replies = await core.channel.wait_replies(1)
        store.set_fault(None)
        failures = core.metrics.registry.get_sample_value(
            "gateway_persist_failures_total", {"kind": kind})
        assert accepted is not None
        assert accepted.session_id
        replay = await core.replay(accepted.session_id)
    warnings = [r for r in caplog.records if r.name == "gateway.agent.recorder"]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert kind in warnings[0].getMessage()
    assert accepted.session_id in warnings[0].getMessage()
    assert "You are" not in warnings[0].getMessage()
    assert replies == [("c1", "finish", "answer one")]
    assert failures == 1
    assert [t.status for t in replay.calls] == ["rebuilt"]
    assert_replay_equals(replay, provider.bodies)
    assert replay.problems == ()


def refuse_assistant(items: Sequence[Mapping[str, Any]]) -> Fault:
    """Refuse every append holding an assistant message (as a broken writer refuses)."""
    roles = {i["message"]["role"] for i in items if i.get("type") == "message"}
    return Refuse("BROKEN") if "assistant" in roles else None


async def test_refused_call_is_named_in_replay_and_gets_no_outcome(tmp_path: Path) -> None:
    """A call whose entry the log refused replays as "not recorded (persist failed: KIND at
    TIME)", gets no outcome, and the next call is recorded with its own number and reason."""
    store = FaultyStore()
    provider = ScriptedProvider()
    provider.script("answer one", "answer two")
    async with running_core(store, provider, tmp_path / "p") as core:
        store.set_fault(Refuse("BROKEN"), {"call"})
        accepted = await core.channel.say("c1", "hi")
        await core.channel.wait_replies(1)
        store.set_fault(None)
        await core.channel.say("c1", "again")
        replies = await core.channel.wait_replies(2)
        assert accepted is not None
        assert accepted.session_id
        replay = await core.replay(accepted.session_id)
        log = await store.read_log("default", accepted.session_id)
    assert [r[1:] for r in replies] == [("finish", "answer one"), ("finish", "answer two")]
    # One outcome, the recorded call's: the unrecorded call's went nowhere (not to call 0).
    assert [e["call"] for e in map(orjson.loads, log.splitlines()) if e["type"] == "outcome"] \
        == [0]
    first, second = replay.calls
    assert (first.status, first.entry_number, first.assistant) == ("not_recorded", None, 1)
    assert first.why is not None
    assert re.fullmatch(r"persist failed: BROKEN at \d{4}-\d\d-\d\dT[\d:.]+Z", first.why)
    assert first.status_text == f"not recorded ({first.why})"
    assert replay.outcome_of(first) is None
    with pytest.raises(NotRebuildableError, match="not recorded"):
        replay.request(first)
    assert (second.status, second.entry_number) == ("rebuilt", 0)
    outcome = replay.outcome_of(second)
    assert outcome is not None
    assert outcome.stop_reason == "end_turn"
    assert replay.request(second, "anthropic") == provider.bodies[1]
    # The refused prompt entry was never the log's: the first one it holds is the initial one.
    assert [p.reason for p in replay.prompts] == ["initial"]


async def test_refused_answer_is_left_out_and_its_tools_not_run(tmp_path: Path) -> None:
    """An answer the log refuses never joins the conversation: its tool calls are not run, the
    text so far is delivered, replay notes the missing answer, and later calls replay exactly."""
    store = FaultyStore()
    provider = ScriptedProvider()
    provider.script(tool_use("memory_write", {"text": "likes tea"}, "t1"), "fine")
    async with running_core(store, provider, tmp_path / "p") as core:
        store.decide = refuse_assistant
        accepted = await core.channel.say("c1", "remember tea")
        await core.channel.wait_replies(1)
        store.decide = None
        await core.channel.say("c1", "and now?")
        replies = await core.channel.wait_replies(2)
        assert accepted is not None
        assert accepted.session_id
        replay = await core.replay(accepted.session_id)
    memory = tmp_path / "p" / "MEMORY.md"
    assert not memory.exists() or "likes tea" not in memory.read_text()
    assert [r[1:] for r in replies] == [("finish", "one moment"), ("finish", "fine")]
    assert [m["role"] for m in provider.bodies[1]["messages"]] == ["user", "user"]
    assert [t.status for t in replay.calls] == ["rebuilt", "rebuilt"]
    assert replay.calls[0].assistant is None
    assert len(replay.calls[0].notes) == 1
    assert replay.calls[0].notes[0].startswith("its answer was not recorded (BROKEN at ")
    assert_replay_equals(replay, provider.bodies)
    assert [g.kind for g in replay.gaps] == ["BROKEN"]
    assert replay.gaps[0].refused == ({"type": "message", "role": "assistant"},
                                      {"type": "outcome", "call": 0})


async def test_refused_inbound_message_is_not_acknowledged(tmp_path: Path) -> None:
    """An inbound message the log refuses is not acknowledged and never reaches the model."""
    store = FaultyStore()
    provider = ScriptedProvider()
    async with running_core(store, provider, tmp_path / "p") as core:
        await core.channel.say("c1", "first")
        await core.channel.wait_replies(1)
        store.set_fault(Refuse("BROKEN"), {"message"})
        with pytest.raises(UnavailableError) as info:  # a channel answers 503: not taken
            await core.channel.say("c1", "lost in the void")
        store.set_fault(None)
        await core.channel.say("c1", "third")
        await core.channel.wait_replies(2)
    assert (info.value.what, info.value.kind) == ("store", "BROKEN")
    texts = [content_text(m["content"]) for m in provider.bodies[1]["messages"]
             if m["role"] == "user"]
    assert texts == ["first", "third"]


async def test_fenced_writer_ends_the_turn_before_the_provider_call(tmp_path: Path) -> None:
    """A call entry refused because the writer was fenced off ends the turn before the call,
    and the conversation is handed back (another worker owns it): no apology, still owed."""
    store = FaultyStore()
    provider = ScriptedProvider()
    async with running_core(store, provider, tmp_path / "p") as core:
        store.set_fault(Refuse("STALE_FENCE"), {"call"})
        await core.channel.say("c1", "hi")
        await until(lambda: store.faults_raised)
        await core.idle()
        queue = core.router.conversations
        assert isinstance(queue, LocalConversations)
        owed = [decode_item(o.item).item.inbound.text for o in queue.journal.owed()]
    assert provider.bodies == []
    assert core.channel.replies == []
    assert owed == ["hi"]


async def test_answer_fenced_off_after_the_call_is_not_delivered(tmp_path: Path) -> None:
    """A writer fenced off while the provider was answering (another worker took the
    conversation) delivers nothing: the answer the log refused would be a second answer, or
    one missing from the log; the item stays owed for the new holder."""
    store = FaultyStore()

    class FencedMeanwhile(ScriptedProvider):
        async def complete(self, request: Any, on_text: Any = None) -> Any:
            store.set_fault(Refuse("STALE_FENCE"), {"message"})  # the answer's append
            return await super().complete(request, on_text)

    provider = FencedMeanwhile()
    async with running_core(store, provider, tmp_path / "p") as core:
        await core.channel.say("c1", "hi")
        await until(lambda: store.faults_raised)
        await core.idle()
        queue = core.router.conversations
        assert isinstance(queue, LocalConversations)
        owed = [decode_item(o.item).item.inbound.text for o in queue.journal.owed()]
    assert len(provider.bodies) == 1
    assert core.channel.replies == []
    assert owed == ["hi"]


async def test_iteration_cap_stops_a_tool_loop(tmp_path: Path) -> None:
    """A model that keeps calling tools is stopped at the iteration cap with an answer."""
    provider = ScriptedProvider()
    provider.script(*[tool_use("kb_search", {"query": "x"}, f"t{i}") for i in range(5)])
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            max_iterations=3) as core:
        accepted = await core.channel.say("c1", "loop forever")
        replies = await core.channel.wait_replies(1)
        assert accepted is not None
        assert accepted.session_id
        replay = await core.replay(accepted.session_id)
    assert replies[0][1] == "finish"
    assert len(provider.bodies) == 3
    assert_replay_equals(replay, provider.bodies)


async def test_streamed_text_equals_the_final_reply_in_a_tool_round(tmp_path: Path) -> None:
    """Deltas of a turn with a tool round add up to exactly the final reply (blank line too)."""
    provider = ScriptedProvider(stream_blocks=True)
    provider.script(tool_use("memory_write", {"text": "likes tea"}, "t1"), "Done: saved")
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p") as core:
        await core.channel.say("c1", "remember that I like tea")
        replies = await core.channel.wait_replies(1)
    streamed = "".join(text for _, kind, text in core.channel.events if kind == "delta")
    assert replies == [("c1", "finish", "one moment\n\nDone: saved")]
    assert streamed == "one moment\n\nDone: saved"


async def test_observer_sees_the_turn_its_calls_and_tools_in_order(tmp_path: Path) -> None:
    """The observer hears turn, call 1, tool, call 2 and their ends in order, inside the
    turn's log context (session and the turn's trace ids bound for the turn, call number
    bound for each call)."""
    observer = RecordingObserver()
    provider = ScriptedProvider()
    provider.script(tool_use("memory_write", {"text": "likes tea"}, "t1"), "noted")
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            observer=observer) as core:
        accepted = await core.channel.say("c1", "remember that I like tea")
        await core.channel.wait_replies(1)
        await core.idle()
    assert accepted is not None
    session = accepted.session_id
    assert observer.events == [
        ("turn", session, {"tenant": "default", "channel": "memory",
                           "conversation": "memory:c1", "session": session,
                           "trace_id": traces.trace_id("default", session, 0),
                           "span_id": traces.turn_span_id("default", session, 0)}),
        ("call", 1, "1"), ("call end", 1, None),
        ("tool", "memory_write", "t1"), ("tool end", "memory_write", False),
        ("call", 2, "2"), ("call end", 2, None),
        ("turn end", "answered"),
    ]
    assert [c.model for c in observer.calls] == ["scripted-1", "scripted-1"]
    assert observer.calls[1].messages[-1]["content"][0]["type"] == "tool_result"
    assert [r.stop_reason for r in observer.results] == ["tool_use", "end_turn"]


async def test_a_failed_call_ends_its_span_with_the_error_kind(tmp_path: Path) -> None:
    """A provider error finishes the call with its kind and the turn as apologised, and the
    turn-latency histogram counts the turn under that outcome."""
    observer = RecordingObserver()
    provider = ScriptedProvider()
    provider.script(ProviderRateLimited("scripted: 429"))
    async with running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                            observer=observer) as core:
        await core.channel.say("c1", "hi")
        await core.channel.wait_replies(1)
        await core.idle()
        metrics = core.metrics
    assert observer.events[1:] == [("call", 1, "1"), ("call end", 1, "rate_limited"),
                                   ("turn end", "apologised")]
    count = metrics.registry.get_sample_value(
        "gateway_turn_latency_seconds_count", {"channel": "memory", "outcome": "apologised"})
    calls = metrics.registry.get_sample_value(
        "gateway_provider_latency_seconds_count",
        {"provider": "scripted", "model": "scripted-1", "outcome": "error"})
    assert (count, calls) == (1.0, 1.0)


async def test_values_orjson_cannot_take_are_recorded_and_replayed_exactly(
    tmp_path: Path
) -> None:
    """A tool input holding 2**70, NaN and a lone surrogate is recorded (no persist failure),
    every later call replays to the exact body sent, and a resumed session sees it exactly."""
    odd = {"big": 2**70, "nan": float("nan"), "text": "half \ud83d"}
    provider = ScriptedProvider()
    provider.script(tool_use("kb_search", odd, "t1"), "done", "still here")
    store = JsonlSessionStore(tmp_path / "d")
    async with running_core(store, provider, tmp_path / "p") as core:
        accepted = await core.channel.say("c1", "look it up")
        await core.channel.wait_replies(1)
        failures = sum(s.value for m in core.metrics.persist_failures.collect()
                       for s in m.samples if s.name.endswith("_total"))
    assert accepted is not None
    assert accepted.session_id
    async with running_core(store, provider, tmp_path / "p") as core:  # resumed from the log
        await core.channel.say("c1", "and again")
        await core.channel.wait_replies(1)
        replay = await core.replay(accepted.session_id)
    assert failures == 0
    assert [t.status for t in replay.calls] == ["rebuilt"] * 3
    sent = [dumps(replay.request(t, "anthropic")) for t in replay.calls]
    assert sent == [dumps(body) for body in provider.bodies]
    assert dumps(provider.bodies[2]["messages"][1]["content"][1]["input"]) == dumps(odd)
