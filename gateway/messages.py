"""What flows between channels, the router and the agent loop: frozen records, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sessions.names import DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class ConversationKey:
    """Identifies one conversation: the unit that gets one session and one turn at a time."""

    channel: str
    chat: str
    tenant: str = DEFAULT_TENANT
    thread: str | None = None

    def label(self) -> str:
        """Stable printable form, stored in the session header as ``conversation``."""
        base = f"{self.channel}:{self.chat}"
        return f"{base}:{self.thread}" if self.thread else base


@dataclass(frozen=True, slots=True)
class Sender:
    id: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Inbound:
    """One message from a person, as a channel adapter hands it to the router.

    ``platform_id`` identifies the delivery on its platform (Telegram update id, Slack
    team/channel/ts) so duplicates can be dropped before they reach a session.
    """

    key: ConversationKey
    sender: Sender
    text: str
    platform_id: str | None = None
    chat_type: str = "private"
    received_at: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ChannelContext:
    """What the persona's channel-context section says about where the agent is speaking."""

    channel: str
    chat_type: str
    speaker: str | None
    tenant: str = DEFAULT_TENANT
