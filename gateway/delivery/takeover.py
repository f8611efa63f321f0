"""Taking over an interrupted turn: what the session log says about a resumed item.

When a worker dies mid-turn, the next holder gets the item again, marked ``resumed``. It may
never have been recorded, or recorded and partly answered, or answered with only the queue
update missing. Messages carry their item id in the entry's ``meta.item``, and a
conversation's turns are contiguous in the log (a message is recorded as its turn starts), so
everything after the item's message belongs to its turn. :func:`locate` reads that off the
log (pure); :func:`prepare_rerun` sets a conversation up to finish the turn without recording
the message a second time. Where the answer's messages are on the platform (``delivery``
entries, noted before the answer's text went into them) comes back with it, so the answer
is finished by editing those messages, never by sending it again; a notice, a refusal or an
apology recorded for it (``reply``, ``refusal`` entries) counts as its answer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.agent.conversation import Conversation
from gateway.agent.loop import CAPPED
from gateway.agent.window import has_tool_use
from gateway.edge.messages import Inbound
from sessions.messages import find_item
from sessions.records import MessageDict
from sessions.scan import message_text

Status = Literal["answered", "apologised", "capped", "interrupted"]

INTERRUPTED_TOOL = "This tool run was interrupted (the gateway worker running it stopped)."


@dataclass(frozen=True, slots=True)
class Found:
    """Where a resumed item was recorded and how far its turn got."""

    index: int
    status: Status
    text: str
    """The answer sent when the turn ended (answered, capped; a recorded notice, refusal or
    apology); empty otherwise."""
    open_tool_uses: tuple[str, ...] = ()
    """Tool calls of the last answer that have no results (the worker died running them)."""
    started: bool = True
    """Whether its turn had begun (False: it was queued, recorded but never answered)."""
    message: MessageDict | None = field(default=None, compare=False)
    """The item's message as recorded (its attachment references, once taken in)."""
    notice: str | None = field(default=None, compare=False)
    """The sentence recorded about files that were refused, if any."""
    placed: tuple[tuple[int, dict[str, Any]], ...] = field(default=(), compare=False)
    """Where the answer's messages are on the platform, ``(part, ref)`` (noted before its
    text went into them): finished by editing these."""


def locate(data: bytes, item_id: str, *, max_iterations: int) -> Found | None:
    """The item's message in the session log ``data``, or ``None`` if it was never recorded."""
    trace = find_item(data, item_id)
    if trace is None:
        return None
    after, placed = trace.after, trace.placed
    replies = [m for m in after if m.get("role") == "assistant"]
    texts = [t for t in (message_text(m.get("content")) for m in replies) if t]
    if any(not has_tool_use(m) for m in replies):
        return Found(trace.index, "answered", "\n\n".join(texts), placed=placed)
    if trace.reply is not None:  # a notice, a refusal or an apology: recorded, then sent
        kind, text = trace.reply
        return Found(trace.index, "apologised" if kind == "apology" else "answered", text,
                     placed=placed)
    if trace.failed:
        return Found(trace.index, "apologised", "", placed=placed)
    if len(replies) >= max_iterations:
        return Found(trace.index, "capped", "\n\n".join(texts) or CAPPED, placed=placed)
    open_uses: tuple[str, ...] = ()
    if after and after[-1].get("role") == "assistant":
        open_uses = tuple(str(b.get("id")) for b in after[-1]["content"]
                          if isinstance(b, dict) and b.get("type") == "tool_use")
    notice = trace.meta.get("notice")
    return Found(trace.index, "interrupted", "", open_uses, trace.started, trace.message,
                 notice if isinstance(notice, str) else None, placed)


def as_recorded(inbound: Inbound, found: Found) -> Inbound:
    """A deferred inbound (files still as references) as its log records it: taken in before
    the stop, so its attachment references and its notice come from the recorded message,
    and nothing is downloaded again."""
    content = found.message.get("content") if found.message is not None else None
    refs = tuple(dict(b) for b in content if isinstance(b, dict)
                 and b.get("type") == "attachment") if isinstance(content, list) else ()
    return dataclasses.replace(inbound, attachments=(), parts=refs, notice=found.notice)


async def prepare_rerun(conv: Conversation, found: Found) -> None:
    """Let the agent loop finish the interrupted turn of the message at ``found.index``.

    The message is already in the conversation (resumed from the log, so the loop's
    ``begin`` leaves it where it is); tool calls left without results get an error result, so
    the provider sees a well-formed exchange and can call again.
    """
    if found.open_tool_uses:
        await conv.add_tool_results({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use, "content": INTERRUPTED_TOOL,
             "is_error": True}
            for use in found.open_tool_uses
        ]})
