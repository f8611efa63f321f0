"""What a firing hands the router: a scheduled turn's inbound message, and where it goes.

The trigger enters its conversation like any message, so it is owed, recorded, answered and
replayed the same way: its text is ``scheduled: <id> <instruction>`` (what the model reads and
the log keeps), its sender the person the conversation is with (a one-to-one chat) or who set
it (a group: ``[1001] scheduled: ...``, ``[operator] ...``), its platform id
``schedule:<id>:<occurrence ms>`` (the owed queue's one dedup step: an occurrence delivered
twice, by a worker killed mid-delivery and the one after it, is owed once), and its ``meta``
says which schedule, which occurrence and who set it (the log keeps it with the message:
the viewer and ``gateway replay --list`` mark scheduled turns by it).

Where it goes follows the platforms' rules (:class:`gateway.edge.channel.ProactiveChannel`):
a conversation that has never talked to the bot is written to only on a platform that allows
it (Slack), and a person's one-to-one chat is opened by the channel when the schedule names
the person, not the chat (an operator's ``--to slack:U0123``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from gateway.edge.channel import Channel, ProactiveChannel
from gateway.edge.messages import SCHEDULED, ConversationKey, Inbound, Sender
from gateway.usage.limits import iso_time
from sessions.schedules import ScheduleRecord
from sessions.store import SessionStore

META: Final = SCHEDULED
PREFIX: Final = "scheduled:"


def text_of(record: ScheduleRecord) -> str:
    return f"{PREFIX} {record.id} {record.instruction}"


def platform_id(record: ScheduleRecord, occurrence: float) -> str:
    return f"schedule:{record.id}:{round(occurrence * 1000)}"


def sender_of(record: ScheduleRecord) -> Sender:
    """The person a one-to-one chat is with; in a group, who set the schedule."""
    target = record.target
    if target.chat_type == "private":
        return Sender(target.person or target.chat)
    creator = record.created_by
    return Sender(creator.rsplit(":", 1)[-1] if creator.startswith("person:") else creator)


def inbound_for(record: ScheduleRecord, key: ConversationKey, occurrence: float,
                now: float) -> Inbound:
    """The inbound of ``record``'s ``occurrence`` in conversation ``key``."""
    meta: dict[str, Any] = {META: {"schedule": record.id, "occurrence": iso_time(occurrence),
                                   "created_by": record.created_by}}
    return Inbound(key=key, sender=sender_of(record), text=text_of(record),
                   platform_id=platform_id(record, occurrence),
                   chat_type=record.target.chat_type, received_at=now, meta=meta)


class Reach:
    """Where a schedule may speak now: its conversation key, or why not (see the module
    docstring). ``channel`` finds a running channel by name."""

    def __init__(self, channel: Callable[[str], Channel | None], sessions: SessionStore) -> None:
        self.channel = channel
        self.sessions = sessions

    async def key_of(self, record: ScheduleRecord) -> ConversationKey | str:
        """The conversation key, or the reason it cannot be reached (``unreachable: ...``)."""
        target = record.target
        channel = self.channel(target.channel)
        if channel is None:
            return f"no channel {target.channel} runs here"
        proactive = channel if isinstance(channel, ProactiveChannel) else None
        chat = target.chat
        if not chat:
            if target.person is None:
                return "no chat or person to write to"
            chat = (await proactive.direct_chat(target.person, record.tenant)
                    if proactive is not None else target.person) or ""
            if not chat:
                return f"{target.channel} did not open a chat with {target.person}"
        key = ConversationKey(target.channel, chat, record.tenant, target.thread)
        speaks_first = proactive is not None and proactive.starts_conversations
        if not speaks_first and await self.sessions.latest_session(
                record.tenant, key.label()) is None:
            return f"{key.label()} has never talked to the bot"
        return key
