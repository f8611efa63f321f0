"""Who said it: the user message as the model sees it, and the context a turn runs in.

In a shared conversation (a group, a channel, a thread) several people write, so each user
message names its author at the start of its text, ``[Ada Lovelace (1001)] hello``: display
name and the stable platform id (the name alone can change or repeat). The text built here is
what the session records and what every call sends, so replay rebuilds it exactly. A one-to-one
conversation has one speaker, named in the prompt's channel section instead, and its messages
are recorded as typed. Names come from the platform: they are squashed to one short line and
cleared of brackets, so a display name cannot forge the frame or another speaker's line start.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Final

from gateway.edge import messages
from gateway.edge.messages import SCHEDULED, ChannelContext, Inbound, Sender
from gateway.edge.scopes import ONE_TO_ONE

MAX_NAME_CHARS: Final = 64
MAX_ID_CHARS: Final = 64
_FRAME: Final = re.compile(r"[\[\]()]")


def user_message(inbound: Inbound) -> dict[str, Any]:
    """The user message recorded for ``inbound`` and sent to the model
    (:func:`gateway.edge.messages.user_message`, attachments included), its text starting with the
    speaker in a shared chat (alone when files came without text)."""
    if inbound.chat_type == ONE_TO_ONE:
        return messages.user_message(inbound)
    who = attribution(inbound.sender)
    text = f"{who} {inbound.text}" if inbound.text.strip() else who
    return messages.user_message(dataclasses.replace(inbound, text=text))


def attribution(sender: Sender) -> str:
    """``[name (id)]``, or ``[id]`` when the platform gave no name."""
    ident = _clean(sender.id, MAX_ID_CHARS) or "?"
    name = _clean(sender.name or "", MAX_NAME_CHARS)
    return f"[{name} ({ident})]" if name and name != ident else f"[{ident}]"


def context_of(inbound: Inbound) -> ChannelContext:
    """The context a turn for ``inbound`` runs in (prompt, tools and memory scope)."""
    scheduled = inbound.meta.get(SCHEDULED)
    return ChannelContext(
        channel=inbound.key.channel,
        chat_type=inbound.chat_type,
        speaker=inbound.sender.name or inbound.sender.id,
        tenant=inbound.key.tenant,
        chat=inbound.key.chat,
        person=inbound.sender.id,
        thread=inbound.key.thread,
        scheduled_by=str(scheduled.get("created_by", "")) if isinstance(scheduled, dict)
        else None,
    )


def _clean(value: str, limit: int) -> str:
    squashed = " ".join(_FRAME.sub(" ", value).split())
    return squashed if len(squashed) <= limit else squashed[: limit - 1].rstrip() + "…"
