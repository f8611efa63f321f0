"""An in-memory channel: the test and benchmark fake at the channel seam.

``await channel.say(chat, text)`` delivers an inbound message; every reply event lands in
``channel.events`` as ``(chat, kind, text)`` in order, and :meth:`wait_replies` waits for
finished replies.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

from gateway.edge.channel import Accepted, Deliver, ReplySink
from gateway.edge.messages import Attachment, ConversationKey, Inbound, OutboundFile, Sender


class MemorySink:
    def __init__(self, channel: MemoryChannel, inbound: Inbound) -> None:
        self._channel = channel
        self._chat = inbound.key.chat

    async def typing(self) -> None:
        self._channel.events.append((self._chat, "typing", ""))

    async def delta(self, text: str) -> None:
        self._channel.events.append((self._chat, "delta", text))

    async def retract(self) -> None:
        self._channel.events.append((self._chat, "retract", ""))

    async def finish(self, text: str) -> None:
        await self._channel.sending()
        self._channel.record_final(self._chat, "finish", text)

    async def fail(self, text: str) -> None:
        await self._channel.sending()
        self._channel.record_final(self._chat, "fail", text)

    async def send_file(self, file: OutboundFile) -> None:
        self._channel.files.append((self._chat, file))
        self._channel.events.append((self._chat, "file", file.name))


class MemoryChannel:
    """Channel fake: no I/O, records everything."""

    def __init__(self, name: str = "memory", tenant: str = "default") -> None:
        self.name = name
        self.tenant = tenant
        self.events: list[tuple[str, str, str]] = []
        self.replies: list[tuple[str, str, str]] = []
        self.files: list[tuple[str, OutboundFile]] = []
        self._deliver: Deliver | None = None
        self._ids = itertools.count(1)
        self._changed = asyncio.Condition()
        self.send_gate: asyncio.Event | None = None
        """Set: a final reply is held, as if still on its way, until the event is set."""
        self.holding = asyncio.Event()
        """Set once a final reply waits at ``send_gate``."""

    async def start(self, deliver: Deliver) -> None:
        self._deliver = deliver

    def reply_sink(self, inbound: Inbound) -> ReplySink:
        return MemorySink(self, inbound)

    def health(self) -> Mapping[str, Any]:
        return {"ok": True, "replies": len(self.replies)}

    async def aclose(self) -> None:
        self._deliver = None

    async def say(self, chat: str, text: str, *, sender: str = "user",
                  platform_id: str | None = None, chat_type: str = "private",
                  name: str | None = None,
                  attachments: tuple[Attachment, ...] = ()) -> Accepted | None:
        """Deliver a message from ``sender`` (display ``name``, default the id) in ``chat``
        (one-to-one unless ``chat_type`` says otherwise); returns the router's answer."""
        if self._deliver is None:
            raise RuntimeError("channel not started")
        inbound = Inbound(
            key=ConversationKey(self.name, chat, self.tenant),
            sender=Sender(sender, name or sender), text=text, chat_type=chat_type,
            platform_id=platform_id or f"m{next(self._ids)}", attachments=attachments,
        )
        result = await self._deliver(inbound)
        return result if isinstance(result, Accepted) else None

    async def sending(self) -> None:
        if self.send_gate is not None:
            self.holding.set()
            await self.send_gate.wait()

    def record_final(self, chat: str, kind: str, text: str) -> None:
        self.events.append((chat, kind, text))
        self.replies.append((chat, kind, text))
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_replies(
        self, count: int, timeout: float = 10.0  # noqa: ASYNC109 (a test helper: the bound is the point)
    ) -> list[tuple[str, str, str]]:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(self.replies) >= count)
        return list(self.replies)
