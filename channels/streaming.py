"""Streaming by editing a message: the reply sink of platforms that stream with edits.

Deltas build a plain-text preview that is sent once (not before ``preview_after`` seconds of
streaming) and then edited at most every ``min_interval`` seconds (platforms rate-limit edits);
a typing indicator appears once a turn has run ``typing_delay`` seconds and is renewed every
``typing_interval`` while it runs. The final text is handed to the platform, which
renders it (Markdown -> HTML/mrkdwn, split to the platform's limits) and replaces the preview;
a reply abandoned instead (:class:`gateway.edge.channel.RetractSink`) has its preview deleted.
Delivery errors are logged and counted by the platform target, never raised into the turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from gateway.edge.channel import Placement
from gateway.edge.errors import ChannelError
from gateway.edge.messages import OutboundFile

TYPING_DELAY = 0.5
"""Seconds a turn runs before the typing indicator is shown."""

PREVIEW_LIMIT = 3500
"""Previews are cut here: a preview is temporary, the final rendering does the real split."""


class EditTarget(Protocol):
    """One conversation on a platform that can send and edit messages."""

    async def typing(self) -> None: ...

    async def send_preview(self, text: str) -> str | None:
        """Send a plain-text preview; return its message reference (None if it failed)."""
        ...

    async def edit_preview(self, ref: str, text: str) -> None: ...

    async def deliver_final(self, text: str, preview: str | None) -> None:
        """Render and deliver the final text, replacing the preview message if there is one."""
        ...

    async def retract(self, preview: str | None) -> None:
        """The final text will not come: delete the preview message if there is one (and any
        typing marker the platform keeps). Never raises: a failure is logged once."""
        ...


@runtime_checkable
class PlacingTarget(Protocol):
    """A target that reconciles the answer with the platform (see
    :class:`gateway.edge.channel.PlacingSink`, whose contract it keeps for the streamer)."""

    def place(self, placement: Placement) -> None: ...


@runtime_checkable
class FileTarget(Protocol):
    """A target that can also send a file as its own message (raising ChannelError when the
    platform refuses it)."""

    async def send_file(self, file: OutboundFile) -> None: ...


class EditStreamer:
    """A :class:`gateway.edge.channel.ReplySink` over an :class:`EditTarget`."""

    def __init__(self, target: EditTarget, *, min_interval: float = 1.0,
                 typing_interval: float = 4.0, stream: bool = True,
                 typing_delay: float = TYPING_DELAY, preview_after: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self.clock = clock
        self.min_interval = min_interval
        self.typing_interval = typing_interval
        self.typing_delay = typing_delay
        self.preview_after = preview_after
        self._first_delta: float | None = None
        self.stream = stream
        self._text = ""
        self._ref: str | None = None
        self._sent_text = ""
        self._last_edit = float("-inf")  # the first preview is never held back
        self._typing_timer: asyncio.TimerHandle | None = None
        self._typing_task: asyncio.Task[None] | None = None
        self._done = False
        self._retracted = False

    async def typing(self) -> None:
        # Never awaited on the turn's path: the indicator starts after ``typing_delay``, so a
        # reply that is ready sooner costs no platform call at all (each one is a round trip
        # and a few ms of CPU, and a flash of "typing..." helps nobody).
        if self._typing_task is not None or self._typing_timer is not None or self._done:
            return
        loop = asyncio.get_running_loop()
        if self.typing_delay <= 0:  # "at once": shown before the turn goes on
            await self.target.typing()
            self._typing_task = loop.create_task(self._renew_typing(self.typing_interval))
        else:
            # A timer until the indicator first shows, not a task: most replies are ready
            # sooner, and a timer is stopped without a round of the loop before the reply.
            self._typing_timer = loop.call_later(self.typing_delay, self._start_typing)

    def _start_typing(self) -> None:
        self._typing_timer = None
        if not self._done:
            self._typing_task = asyncio.get_running_loop().create_task(self._renew_typing(0.0))

    async def _renew_typing(self, first_wait: float) -> None:
        if first_wait > 0:
            await asyncio.sleep(first_wait)
        while not self._done:
            await self.target.typing()
            await asyncio.sleep(self.typing_interval)

    async def delta(self, text: str) -> None:
        if not self.stream or self._done:
            return
        self._text += text
        now = self.clock()
        if self._first_delta is None:
            self._first_delta = now
        if now - self._first_delta < self.preview_after:
            return  # a quick reply goes out once, as its final rendering
        if now - self._last_edit < self.min_interval:
            return
        preview = _preview(self._text)
        if not preview.strip() or preview == self._sent_text:
            return
        self._last_edit = now
        if self._ref is None:
            self._ref = await self.target.send_preview(preview)
        else:
            await self.target.edit_preview(self._ref, preview)
        self._sent_text = preview

    async def finish(self, text: str) -> None:
        await self._stop_typing()
        await self.target.deliver_final(text, self._ref)

    async def fail(self, text: str) -> None:
        await self._stop_typing()
        await self.target.deliver_final(text, self._ref)

    def place(self, placement: Placement) -> None:
        """Hand the placement to a target that reconciles (others ignore it)."""
        if isinstance(self.target, PlacingTarget):
            self.target.place(placement)

    async def retract(self) -> None:
        """Delete the preview: this turn's final text will not come (another worker answers).
        Deltas after it are ignored; a second call does nothing."""
        if self._retracted:
            return
        self._retracted = True
        await self._stop_typing()
        preview, self._ref = self._ref, None
        await self.target.retract(preview)

    async def send_file(self, file: OutboundFile) -> None:
        """Deliver a file now (the ``send_file`` tool); the text stream goes on after it."""
        if not isinstance(self.target, FileTarget):
            raise ChannelError("this channel cannot send files")
        await self.target.send_file(file)

    async def _stop_typing(self) -> None:
        self._done = True
        timer, self._typing_timer = self._typing_timer, None
        if timer is not None:
            timer.cancel()
        task, self._typing_task = self._typing_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # waits for the cancel without swallowing our own


def _preview(text: str) -> str:
    return text if len(text) <= PREVIEW_LIMIT else text[:PREVIEW_LIMIT] + " …"
