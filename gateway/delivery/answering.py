"""The reply sink the router hands a turn: it marks the item answered right after its reply.

The router wraps the channel's sink in :class:`Answering` as the item's turn starts: the
moment the platform took the final reply (``finish`` or ``fail``) the item is marked answered,
the narrowest window there is between a platform taking a reply and the gateway knowing it
did. With several workers the final reply first waits for the turn's entries to be saved
(``saved``): the next holder of the conversation would otherwise find the message unanswered
in the log and answer it again. When that wait fails (the lease went, the worker stops), or
the turn ends without a final reply at all, the reply is *abandoned* (:meth:`abandon`): what
the sink streamed of it is taken back (:class:`gateway.edge.channel.RetractSink`), since the next
holder's answer is the one the person should read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gateway.edge.channel import FileSink, ReplySink, RetractSink
from gateway.edge.errors import ChannelError
from gateway.edge.messages import OutboundFile

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None]], None]
"""Runs a coroutine in a task of its own, owned by the caller (the router's task group)."""

RETRACT_TIMEOUT = 10.0
"""Seconds a retraction may take (it runs after its turn, and a shutdown waits for it)."""


class Answering:
    """A reply sink that calls ``answered`` once, right after ``finish`` or ``fail``; with
    ``saved``, awaits it first (the final reply goes out only once the turn's entries are in
    the log). Streamed deltas go out at once: a preview is not the answer.

    ``spawn``: where an abandoned reply's retraction runs. It must outlive the cancellation
    that ends the turn (the lease guard cancels the serving task again and again until it
    has left), so it runs in a task of its own; without ``spawn`` nothing is retracted."""

    def __init__(self, sink: ReplySink, answered: Callable[[], Awaitable[None]],
                 saved: Callable[[], Awaitable[None]] | None = None,
                 spawn: Spawn | None = None) -> None:
        self._sink = sink
        self._answered: Callable[[], Awaitable[None]] | None = answered
        self._saved = saved
        self._spawn = spawn
        self._settled = False  # a final reply went out, or the reply was abandoned

    async def typing(self) -> None:
        await self._sink.typing()

    async def delta(self, text: str) -> None:
        await self._sink.delta(text)

    async def finish(self, text: str) -> None:
        await self._ready()
        await self._sink.finish(text)
        await self._mark()

    async def fail(self, text: str) -> None:
        await self._ready()
        await self._sink.fail(text)
        await self._mark()

    async def send_file(self, file: OutboundFile) -> None:
        if not isinstance(self._sink, FileSink):
            raise ChannelError("this channel cannot send files")
        await self._sink.send_file(file)

    def abandon(self) -> None:
        """No final reply will come from this turn: retract what the sink showed of it (in
        a task of ``spawn``'s). Once at most; nothing once a final reply went out."""
        if self._settled:
            return
        self._settled = True
        if self._spawn is not None and isinstance(self._sink, RetractSink):
            self._spawn(self._retract(self._sink))

    async def _ready(self) -> None:
        """Wait for the turn's entries (``saved``); a failed wait abandons the reply."""
        if self._saved is not None:
            try:
                await self._saved()
            except BaseException:
                self.abandon()
                raise
        self._settled = True

    @staticmethod
    async def _retract(sink: RetractSink) -> None:
        try:
            async with asyncio.timeout(RETRACT_TIMEOUT):
                await sink.retract()
        except Exception as exc:  # a sink that broke its contract; the turn is over anyway
            log.warning("retracting an abandoned reply failed (%s)", type(exc).__name__)

    async def _mark(self) -> None:
        answered, self._answered = self._answered, None
        if answered is not None:
            await answered()
