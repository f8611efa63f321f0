"""The reply sink the router hands a turn: it marks the item answered right after its reply.

The router wraps the channel's sink in :class:`Answering` as the item's turn starts: the
moment the platform took the final reply (``finish`` or ``fail``) the item is marked answered,
the narrowest window there is between a platform taking a reply and the gateway knowing it
did. With several workers the final reply first waits for the turn's entries to be saved
(``saved``): the next holder of the conversation would otherwise find the message unanswered
in the log and answer it again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.channel import FileSink, ReplySink
from gateway.errors import ChannelError
from gateway.messages import OutboundFile


class Answering:
    """A reply sink that calls ``answered`` once, right after ``finish`` or ``fail``; with
    ``saved``, awaits it first (the final reply goes out only once the turn's entries are in
    the log). Streamed deltas go out at once: a preview is not the answer."""

    def __init__(self, sink: ReplySink, answered: Callable[[], Awaitable[None]],
                 saved: Callable[[], Awaitable[None]] | None = None) -> None:
        self._sink = sink
        self._answered: Callable[[], Awaitable[None]] | None = answered
        self._saved = saved

    async def typing(self) -> None:
        await self._sink.typing()

    async def delta(self, text: str) -> None:
        await self._sink.delta(text)

    async def finish(self, text: str) -> None:
        if self._saved is not None:
            await self._saved()
        await self._sink.finish(text)
        await self._mark()

    async def fail(self, text: str) -> None:
        if self._saved is not None:
            await self._saved()
        await self._sink.fail(text)
        await self._mark()

    async def send_file(self, file: OutboundFile) -> None:
        if not isinstance(self._sink, FileSink):
            raise ChannelError("this channel cannot send files")
        await self._sink.send_file(file)

    async def _mark(self) -> None:
        answered, self._answered = self._answered, None
        if answered is not None:
            await answered()
