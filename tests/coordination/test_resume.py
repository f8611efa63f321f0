"""Pure parts of a takeover: finding a resumed item in the log, finishing its turn, and the
wire form of queued items."""

from __future__ import annotations

from typing import Any

import orjson

from coordination.keys import Keys, decode_item, encode_item, key_of, member
from gateway.agent.conversation import Conversation
from gateway.agent.recorder import SessionRecorder
from gateway.delivery.takeover import INTERRUPTED_TOOL, Found, locate, prepare_rerun
from gateway.edge.coordination import QueueItem
from gateway.edge.messages import ChannelContext, ConversationKey, Inbound, Sender
from gateway.edge.metrics import Metrics
from sessions.messages import read_messages
from sessions.store import SessionState

USE = {"type": "tool_use", "id": "toolu_1", "name": "memory_write", "input": {"text": "x"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}


def log(*entries: dict[str, Any]) -> bytes:
    lines = [{"type": "session", "seq": 0, "id": "s1", "version": 3}]
    lines += [{"seq": n + 1, **e} for n, e in enumerate(entries)]
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def user(text: str, item: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "message", "message": {"role": "user", "content": text}}
    if item is not None:
        entry["meta"] = {"item": item}
    return entry


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "message": {"role": "assistant", "content": list(blocks)}}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def call(n: int, *window: tuple[int, int]) -> dict[str, Any]:
    return {"type": "call", "call": n, "window": [list(r) for r in window]}


def test_locate_reads_how_far_the_turn_got() -> None:
    """Never recorded, recorded only, mid tool run, answered, apologised, capped."""
    before = [user("hi", "i0"), call(0, (0, 1)), assistant(text("hello"))]
    assert locate(log(*before), "i1", max_iterations=8) is None
    assert locate(log(*before, user("q", "i1")), "i1",
                  max_iterations=8) == Found(2, "interrupted", "", started=False)
    assert locate(log(*before, user("q", "i1"), call(1, (0, 3))), "i1",
                  max_iterations=8) == Found(2, "interrupted", "")
    assert locate(log(*before, user("q", "i1"), call(1, (0, 3)),
                      assistant(text("let me note"), USE)), "i1",
                  max_iterations=8) == Found(2, "interrupted", "", ("toolu_1",))
    tool_round = [assistant(text("noting"), USE),
                  {"type": "message", "message": {"role": "user", "content": [RESULT]}}]
    assert locate(log(*before, user("q", "i1"), call(1, (0, 3)), *tool_round, call(2, (0, 5)),
                      assistant(text("done"))), "i1",
                  max_iterations=8) == Found(2, "answered", "noting\n\ndone")
    assert locate(log(*before, user("q", "i1"), call(1, (0, 3)),
                      {"type": "outcome", "call": 1, "error": {"kind": "timeout"}}), "i1",
                  max_iterations=8) == Found(2, "apologised", "")
    assert locate(log(*before, user("q", "i1"), call(1, (0, 3)), *tool_round), "i1",
                  max_iterations=1) == Found(2, "capped", "noting")


def test_locate_tells_turns_apart_when_messages_arrived_during_others() -> None:
    """In one process a message is recorded on receipt, in the middle of another turn: the
    earlier turn's answer and later items' messages are not taken for its own."""
    entries = [user("first", "i0"), call(0, (0, 1)),
               user("second", "i1"),  # arrived while the first turn's call ran
               assistant(text("answer one")),
               user("third", "i2"),  # queued: its turn never began
               call(1, (0, 1), (2, 3), (1, 2)),  # the second's turn: window ends at it
               assistant(text("answer two"))]
    assert locate(log(*entries), "i0", max_iterations=8) == Found(0, "answered", "answer one")
    assert locate(log(*entries), "i1", max_iterations=8) == Found(1, "answered", "answer two")
    assert locate(log(*entries), "i2", max_iterations=8) == Found(3, "interrupted", "",
                                                                  started=False)


def test_a_recorded_apology_ends_its_turn_before_a_later_answer() -> None:
    """A turn that failed after its call (no outcome written) and whose apology was recorded
    (a ``reply`` entry): the next item's answer, written after it, is not taken for its own.
    (Found by the delivery bench: a browser asking again for the first message was answered
    200 with the second message's answer, and a restart would have sent it there.)"""
    entries = [user("first", "i0"), call(0, (0, 1)),
               user("second", "i1"),  # arrived while the first turn's call ran
               {"type": "reply", "message": 0, "kind": "apology", "text": "Sorry."},
               call(1, (0, 2)),  # the second's turn
               assistant(text("answer two"))]
    assert locate(log(*entries), "i0", max_iterations=8) == Found(0, "apologised", "Sorry.")
    assert locate(log(*entries), "i1", max_iterations=8) == Found(1, "answered", "answer two")


def test_a_recorded_refusal_or_notice_ends_its_turn() -> None:
    """A budget refusal or a files notice recorded for an item is its whole answer: a later
    item's answer that follows is not its own."""
    for kind in ("refusal", "reply"):
        note: dict[str, Any] = {"type": kind, "message": 0, "text": "No."}
        if kind == "reply":
            note["kind"] = "notice"
        entries = [user("first", "i0"), user("second", "i1"), note, call(1, (0, 2)),
                   assistant(text("answer two"))]
        found = locate(log(*entries), "i0", max_iterations=8)
        assert found is not None
        assert (found.status, found.text) == ("answered", "No."), kind


def test_resumed_order_is_the_order_the_turns_built() -> None:
    """Messages recorded on receipt during other turns join where their turn began (right
    before the call whose window ends at them); one whose turn never began is in no order."""
    entries = [user("first", "i0"), call(0, (0, 1)),
               user("second", "i1"),  # arrived while the first turn's call ran
               user("third", "i2"),
               assistant(text("answer one")),
               call(1, (0, 1), (3, 4), (1, 2)),  # the second's turn
               assistant(text("answer two")),
               user("fourth", "i3")]  # queued when the gateway stopped
    logged = read_messages(log(*entries))
    assert logged.order == [0, 3, 1, 4]
    assert logged.unstarted == frozenset({2, 5})


async def test_prepare_rerun_does_not_add_the_message_twice() -> None:
    """Finishing an interrupted turn adds its message once and closes open tool calls."""
    appended: list[list[dict[str, Any]]] = []

    class Writer:
        session_id = "s1"
        tenant = "default"
        state = SessionState()

        async def append(self, entries: Any) -> int:
            appended.append(list(entries))
            return 1

        async def flush(self) -> None:
            return None

        async def sync(self) -> None:
            return None

        async def aclose(self) -> None:
            return None

    messages: list[Any] = [{"role": "user", "content": "q"},
                           {"role": "assistant", "content": [text("noting"), USE]}]
    conv = Conversation(ConversationKey("memory", "c"),
                        SessionRecorder(Writer(), Metrics(), 1.0),
                        ChannelContext("memory", "private", "u"), messages)
    await prepare_rerun(conv, Found(0, "interrupted", "", ("toolu_1",)))
    conv.begin(0)
    assert conv.order.order == [0, 1, 2]
    assert conv.messages[2]["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1",
                                            "content": INTERRUPTED_TOOL, "is_error": True}]
    assert [e["type"] for batch in appended for e in batch] == ["message"]
    conv.begin(await conv.receive({"role": "user", "content": "next"}))  # later turns as usual
    assert conv.order.order == [0, 1, 2, 3]


def test_items_and_conversations_round_trip_through_redis_form() -> None:
    """An inbound survives the queue: key, sender, text, ids and meta; keys carry the prefix."""
    key = ConversationKey("slack", "C1", tenant="acme", thread="17.5")
    inbound = Inbound(key, Sender("U1", "Ann"), "hi there", platform_id="T:C1:17.6",
                      chat_type="channel", received_at=12.5, meta={"username": "ann"})
    raw = encode_item(QueueItem(inbound, sink=None, kind="message", id="abc123"), "w1")
    assert raw.startswith("abc123 ")
    wire = decode_item(raw, resumed=True)
    assert (wire.item.inbound, wire.item.id, wire.item.resumed, wire.origin, wire.relay) == (
        inbound, "abc123", True, "w1", False)
    assert key_of(member(key)) == key
    assert Keys("gw:").lease(key) == "gw:conv:{acme:slack:C1:17.5}:lease"


def test_taken_in_attachments_travel_as_references() -> None:
    """A message whose files were taken in crosses the queue with its reference blocks and
    notice (bytes never go through Redis: they are in the blob store already)."""
    key = ConversationKey("telegram", "42")
    parts = ({"type": "attachment", "hash": "a" * 64, "name": "p.jpg", "media_type": "image/jpeg",
              "size": 10},
             {"type": "text", "text": "[attachment z.zip was not passed on: too big]"})
    inbound = Inbound(key, Sender("42"), "look", parts=parts, notice="I couldn't use z.zip.")
    wire = decode_item(encode_item(QueueItem(inbound, id="i1"), "w1"))
    assert wire.item.inbound == inbound
