"""Reading the conversation back out of a log: its messages, and where one inbound item is.

The registry resumes a conversation from :func:`read_messages`; a takeover (another worker,
or this process after a restart) finds how far an owed item's turn got with
:func:`find_item`. Both read the log's bytes as any store returns them (``read_log``), skip
corrupt lines and a torn tail like every scan, and are the only places outside the store
that know how message entries look.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sessions.encoding import loads_entry
from sessions.records import MessageDict
from sessions.scan import split_lines


def _entries(data: bytes) -> list[dict[str, Any]]:
    lines, _ = split_lines(data)
    out: list[dict[str, Any]] = []
    for raw in lines[1:]:
        entry = loads_entry(raw)  # escaped bodies unfolded, as written
        if entry is not None:
            out.append(entry)
    return out


@dataclass(frozen=True, slots=True)
class Logged:
    """A session's conversation as its log holds it.

    ``messages`` in log order; ``last_ts`` the timestamp of the last one. ``order`` is the
    conversation order the turns built (which windows index): a person's message joins the
    conversation when its turn begins, i.e. right before the first call whose window ends at
    it, and its turn's answers and tool results follow it; in one process a message is
    recorded on receipt, so the log may hold it well before that (while another turn ran).
    ``unstarted`` are people's messages whose turn never began (queued when the gateway
    stopped): they are in no order yet and join it when their turn starts.
    """

    messages: list[MessageDict]
    last_ts: str | None
    order: list[int]
    unstarted: frozenset[int]


def read_messages(data: bytes) -> Logged:
    """The conversation in the log ``data`` (see :class:`Logged`)."""
    out: list[MessageDict] = []
    last_ts: str | None = None
    order: list[int] = []
    waiting: list[int] = []  # people's messages whose turn has not begun
    in_turn = False
    for entry in _entries(data):
        kind = entry.get("type")
        msg = entry.get("message")
        if kind == "message" and isinstance(msg, dict):
            index = len(out)
            out.append(msg)  # a message entry's body, as written
            ts = entry.get("ts")
            last_ts = ts if isinstance(ts, str) else last_ts
            if _plain_user(msg):
                waiting.append(index)
                continue
            if not in_turn and waiting and msg.get("role") == "assistant":
                # An answer whose call was not recorded: its turn is the oldest waiting one.
                order.append(waiting.pop(0))
            order.append(index)
            in_turn = msg.get("role") != "assistant" or _uses_tools(msg)
        elif kind == "call":
            end = _window_end(entry)
            if end is not None and end in waiting:
                waiting.remove(end)  # its turn begins: it joins the conversation here
                order.append(end)
            in_turn = True
        elif kind == "outcome" and entry.get("error"):
            in_turn = False  # the call failed: the turn ended with an apology
    return Logged(out, last_ts, order, frozenset(waiting))


@dataclass(frozen=True, slots=True)
class ItemTrace:
    """An inbound item's message in the log, and what its turn recorded.

    ``index`` is its message index. ``after`` holds its turn's messages (answers and tool
    results, in log order) and ``failed`` says whether one of its turn's calls ended with an
    error outcome (the turn apologised). A turn starts with the first ``call`` entry whose
    window ends at the item's message (the newest message of the conversation when its turn
    began); from there every answer and tool-result message of the session belongs to it, since
    a conversation runs one turn at a time. Plain user messages in between are other items,
    recorded on receipt while this turn ran. No such call: the turn never started.

    ``reply``: an answer that is not a model's, recorded for the message (``reply`` and
    ``refusal`` entries naming its index): ``(kind, text)``, kind ``notice``, ``apology`` or
    ``refusal``. ``placed``: where the answer's messages are on the platform (``delivery``
    entries naming its index), ``(part, ref)`` by part, the last note of a part winning.
    """

    index: int
    after: tuple[MessageDict, ...]
    failed: bool
    started: bool = True
    """Whether a call of its turn was recorded (False: queued, never begun)."""
    message: MessageDict | None = field(default=None, compare=False)
    """The item's message as recorded."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    """The ``meta`` recorded with it (sender, platform id, the notice about refused files)."""
    reply: tuple[str, str] | None = None
    placed: tuple[tuple[int, dict[str, Any]], ...] = ()


def find_item(data: bytes, item_id: str) -> ItemTrace | None:
    """The turn of the message recorded with ``meta.item == item_id``, or ``None`` if there
    is no such message."""
    index = -1
    at: int | None = None
    recorded: dict[str, Any] = {}  # the item's message entry
    ours: set[int] = set()  # the item's message and its turn's tool results
    calls: set[int] = set()
    after: list[MessageDict] = []
    expect: str | None = None  # "answer" after one of its calls, "results" after a tool use
    failed = False
    ended = False  # its final answer (or failure) is read: only notes naming it follow
    reply: tuple[str, str] | None = None
    placed: dict[int, dict[str, Any]] = {}
    for entry in _entries(data):
        kind = entry.get("type")
        if at is not None and kind in _NOTES and entry.get("message") == at:
            _note(entry, placed)
            if kind != "delivery" and reply is None:
                text = entry.get("text")
                reply = (str(entry.get("kind") or kind), text if isinstance(text, str) else "")
                # Its whole answer (a notice, a refusal, an apology): the turn ended here,
                # even when no outcome says so (a turn that failed after its call), and an
                # answer written later is a later turn's.
                ended = True
            continue
        if kind == "message" and isinstance(entry.get("message"), dict):
            index += 1
            message = entry["message"]
            if at is None:
                if _item_of(entry) == item_id:
                    at = index
                    recorded = entry
                    ours.add(index)
            elif ended:
                continue
            elif expect == "answer" and message.get("role") == "assistant":
                after.append(message)
                if not _uses_tools(message):
                    ended = True  # its final answer: what follows is later turns'
                expect = "results"
            elif expect == "results" and not _plain_user(message):
                after.append(message)
                ours.add(index)
                expect = None
        elif at is None or ended:
            continue
        elif kind == "call" and _window_end(entry) in ours:
            if isinstance(entry.get("call"), int):
                calls.add(entry["call"])
            expect = "answer"
        elif kind == "outcome" and entry.get("error") and entry.get("call") in calls:
            failed = True
            ended = True  # the turn ended with an apology
    if at is None:
        return None
    meta = recorded.get("meta")
    return ItemTrace(at, tuple(after), failed, bool(calls), recorded["message"],
                     dict(meta) if isinstance(meta, dict) else {}, reply,
                     tuple(sorted(placed.items())))


_NOTES = frozenset({"delivery", "reply", "refusal"})
"""Entries that name the message they are about by its index (``message``)."""


def _note(entry: dict[str, Any], placed: dict[int, dict[str, Any]]) -> None:
    """A ``delivery`` entry's part and ref into ``placed`` (others are not deliveries)."""
    part, ref = entry.get("part"), entry.get("ref")
    if entry.get("type") == "delivery" and type(part) is int and isinstance(ref, dict):
        placed[part] = ref


def _window_end(entry: dict[str, Any]) -> int | None:
    """The last message index a call's window covers (its newest, in conversation order)."""
    window = entry.get("window")
    if isinstance(window, list) and window:
        last = window[-1]
        if isinstance(last, list) and len(last) == 2 and isinstance(last[1], int):
            return last[1] - 1
    return None


def _plain_user(message: dict[str, Any]) -> bool:
    """A person's message (not tool results): another item, not part of a running turn."""
    if message.get("role") != "user":
        return False
    content = message.get("content")
    return not (isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content))


def _uses_tools(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_use" for b in content)


def _item_of(entry: dict[str, Any]) -> object:
    meta = entry.get("meta")
    return meta.get("item") if isinstance(meta, dict) else None
