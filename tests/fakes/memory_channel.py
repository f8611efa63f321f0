"""An in-memory channel: the test and benchmark fake at the channel seam.

``await channel.say(chat, text)`` delivers an inbound message; every reply event lands in
``channel.events`` as ``(chat, kind, text)`` in order, and :meth:`wait_replies` waits for
finished replies.

With ``placing=True`` its sinks reconcile as Telegram's do
(:class:`gateway.edge.channel.PlacingSink`): the final reply goes into a platform message of
``channel.messages`` (id -> text) that is opened as a placeholder and noted first, or, when
the placement knows one, edited; ``channel.events`` then says ``placeholder`` (with the new
id; a first delta opens it too, as a preview does) and ``edit`` (``"<id>:<text>"``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

from gateway.edge.channel import Accepted, Deliver, Placement, ReplySink
from gateway.edge.messages import Attachment, ConversationKey, Inbound, OutboundFile, Sender


class MemorySink:
    def __init__(self, channel: MemoryChannel, inbound: Inbound) -> None:
        self._channel = channel
        self._chat = inbound.key.chat
        self._placement: Placement | None = None
        self._opened: int | None = None

    async def typing(self) -> None:
        self._channel.events.append((self._chat, "typing", ""))

    async def delta(self, text: str) -> None:
        if self._placement is not None:  # a preview: its message is opened and noted first
            await self._message()
        self._channel.events.append((self._chat, "delta", text))

    async def retract(self) -> None:
        self._channel.events.append((self._chat, "retract", ""))

    async def finish(self, text: str) -> None:
        await self._channel.sending()
        await self._into_message(text)
        self._channel.record_final(self._chat, "finish", text)

    async def fail(self, text: str) -> None:
        await self._channel.sending()
        await self._into_message(text)
        self._channel.record_final(self._chat, "fail", text)

    async def _into_message(self, text: str) -> None:
        """Placed: the text goes into the noted message."""
        if self._placement is None:
            return
        message = await self._message()
        self._channel.messages[message] = text
        self._channel.events.append((self._chat, "edit", f"{message}:{text}"))

    async def _message(self) -> int:
        """The message of the answer: the one noted (known, still there), or a placeholder
        opened and noted now."""
        assert self._placement is not None
        if self._opened is not None:
            return self._opened
        known = [p.ref.get("message") for p in self._placement.known if p.part == 0]
        message = known[0] if known else None
        if not isinstance(message, int) or message not in self._channel.messages:
            message = next(self._channel.message_ids)
            self._channel.messages[message] = "…"
            self._channel.events.append((self._chat, "placeholder", str(message)))
            await self._placement.note(0, {"message": message})
        self._opened = message
        return message

    async def send_file(self, file: OutboundFile) -> None:
        self._channel.files.append((self._chat, file))
        self._channel.events.append((self._chat, "file", file.name))


class PlacingMemorySink(MemorySink):
    """A :class:`MemorySink` that reconciles (see the module docstring)."""

    def place(self, placement: Placement) -> None:
        self._placement = placement


class MemoryChannel:
    """Channel fake: no I/O, records everything."""

    def __init__(self, name: str = "memory", tenant: str = "default", *,
                 placing: bool = False) -> None:
        self.name = name
        self.tenant = tenant
        self.placing = placing
        self.messages: dict[int, str] = {}
        """The platform's messages, by id (placing sinks only)."""
        self.message_ids = itertools.count(1)
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
        return PlacingMemorySink(self, inbound) if self.placing else MemorySink(self, inbound)

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
