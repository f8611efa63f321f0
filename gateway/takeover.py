"""Taking over an interrupted turn: what the session log says about a resumed item.

When a worker dies mid-turn, the next holder gets the item again, marked ``resumed``. It may
never have been recorded, or recorded and partly answered, or answered with only the queue
update missing. Shared-mode messages carry their item id in the entry's ``meta.item``, and a
conversation's turns are contiguous in the log (a message is recorded as its turn starts), so
everything after the item's message belongs to its turn. :func:`locate` reads that off the
log (pure); :func:`prepare_rerun` sets a conversation up to finish the turn without recording
the message a second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.conversation import Conversation
from gateway.turn import CAPPED
from gateway.window import ConversationOrder, has_tool_use
from sessions.encoding import loads_entry
from sessions.records import MessageDict
from sessions.scan import message_text, split_lines

Status = Literal["answered", "apologised", "capped", "interrupted"]

INTERRUPTED_TOOL = "This tool run was interrupted (the gateway worker running it stopped)."


@dataclass(frozen=True, slots=True)
class Found:
    """Where a resumed item was recorded and how far its turn got."""

    index: int
    status: Status
    text: str
    """The answer sent when the turn ended (answered, capped); empty otherwise."""
    open_tool_uses: tuple[str, ...] = ()
    """Tool calls of the last answer that have no results (the worker died running them)."""


def locate(data: bytes, item_id: str, *, max_iterations: int) -> Found | None:
    """The item's message in the session log ``data``, or ``None`` if it was never recorded."""
    lines, _ = split_lines(data)
    index = -1
    at: int | None = None
    after: list[MessageDict] = []
    failed = False
    for raw in lines[1:]:
        entry = _entry(raw)
        if entry is None:
            continue
        kind = entry.get("type")
        if kind == "message" and isinstance(entry.get("message"), dict):
            index += 1
            if at is not None:
                after.append(entry["message"])
            elif _item_of(entry) == item_id:
                at = index
        elif kind == "outcome" and at is not None and entry.get("error"):
            failed = True
    if at is None:
        return None
    replies = [m for m in after if m.get("role") == "assistant"]
    texts = [t for t in (message_text(m.get("content")) for m in replies) if t]
    if any(not has_tool_use(m) for m in replies):
        return Found(at, "answered", "\n\n".join(texts))
    if failed:
        return Found(at, "apologised", "")
    if len(replies) >= max_iterations:
        return Found(at, "capped", "\n\n".join(texts) or CAPPED)
    open_uses: tuple[str, ...] = ()
    if after and after[-1].get("role") == "assistant":
        open_uses = tuple(str(b.get("id")) for b in after[-1]["content"]
                          if isinstance(b, dict) and b.get("type") == "tool_use")
    return Found(at, "interrupted", "", open_uses)


async def prepare_rerun(conv: Conversation, found: Found) -> None:
    """Let the agent loop finish the interrupted turn of the message at ``found.index``.

    The message is already in the conversation (resumed from the log), so the loop's
    ``begin`` must not add it again; tool calls left without results get an error result, so
    the provider sees a well-formed exchange and can call again.
    """
    if found.open_tool_uses:
        await conv.add_tool_results({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use, "content": INTERRUPTED_TOOL,
             "is_error": True}
            for use in found.open_tool_uses
        ]})
    order = _SkipOnce()
    for index in conv.order.order:
        order.append(index, conv.costs[index])
    order.skip = found.index
    conv.order = order


class _SkipOnce(ConversationOrder):
    """A conversation order whose next ``append(skip)`` is ignored (it is already there)."""

    __slots__ = ("skip",)

    def __init__(self) -> None:
        super().__init__()
        self.skip: int | None = None

    def append(self, index: int, cost: int) -> None:
        if index == self.skip:
            self.skip = None
            return
        super().append(index, cost)


def _entry(raw: bytes) -> dict[str, Any] | None:
    return loads_entry(raw)


def _item_of(entry: dict[str, Any]) -> object:
    meta = entry.get("meta")
    return meta.get("item") if isinstance(meta, dict) else None
