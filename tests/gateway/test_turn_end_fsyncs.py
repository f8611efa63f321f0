"""The two fsyncs at the end of a turn (the owed journal's ``paid`` line, the session log)
run at the same time, and the conversation's next message waits for both."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from coordination.journal import FileJournal
from coordination.local import LocalConversations
from gateway.providers.base import ProviderRequest, ProviderResponse, TextSink
from sessions.jsonl import JsonlSessionStore
from tests.fakes.disk import FaultyDisk
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core

WAIT = 30.0  # seconds; only a broken test (or the old, sequential code) waits this long


class Pair:
    """Each fsync waits (bounded) until the other file's fsync has started too, recording
    ``(file, "start"/"end"/"alone")`` into ``events``; off once ``armed`` is cleared."""

    def __init__(self, events: list[tuple[str, str]]) -> None:
        self.events = events
        self.armed = True
        self._barrier = threading.Barrier(2)

    def fsync(self, name: str, fd: int) -> None:
        if self.armed:
            self.events.append((name, "start"))
            try:
                self._barrier.wait(WAIT)
            except threading.BrokenBarrierError:
                self.events.append((name, "alone"))
                self._barrier.reset()
        os.fsync(fd)
        if self.armed:
            self.events.append((name, "end"))


class SessionDisk(FaultyDisk):
    def __init__(self, pair: Pair) -> None:
        super().__init__()
        self.pair = pair

    def fsync(self, fd: int) -> None:
        self.pair.fsync("session", fd)


class Echo(ScriptedProvider):
    def __init__(self, events: list[tuple[str, str]]) -> None:
        super().__init__()
        self.events = events

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        last = str(request.messages[-1]["content"])
        self.events.append(("call", last))
        return ProviderResponse(message={"role": "assistant",
                                         "content": [{"type": "text", "text": f"re:{last}"}]},
                                stop_reason="end_turn")


async def test_the_turn_end_fsyncs_overlap_and_the_next_message_waits(tmp_path: Path) -> None:
    events: list[tuple[str, str]] = []
    pair = Pair(events)
    journal = FileJournal(tmp_path / "d" / "state" / "delivery.jsonl",
                          sync_file=lambda fd: pair.fsync("journal", fd))
    store = JsonlSessionStore(tmp_path / "d", ops=SessionDisk(pair))
    async with running_core(store, Echo(events), tmp_path / "p",
                            conversations=LocalConversations(journal)) as core:
        await core.channel.say("a", "one")
        await core.channel.say("a", "two")
        replies = await core.channel.wait_replies(2, timeout=WAIT)
        await core.idle(WAIT)
        pair.armed = False
    assert [r[2] for r in replies] == ["re:one", "re:two"]

    # Per turn: the provider call, both fsyncs started, both ended (in either order).
    phases = [kind if name != "call" else f"call {kind}" for name, kind in events]
    assert phases == ["call one", "start", "start", "end", "end",
                      "call two", "start", "start", "end", "end"], events
    for turn in (events[1:5], events[6:10]):
        assert sorted(name for name, kind in turn if kind == "start") == ["journal", "session"]
