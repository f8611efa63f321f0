"""The reply sink that tells the person first what was refused, then streams the answer.

When a message came with files the gateway could not use and the model is still called (for
its text or its other files), the person gets one reply: the notice, a blank line, the answer.
The notice is recorded in the message's ``meta`` (``notice``), the answer as usual.
"""

from __future__ import annotations

from gateway.edge.channel import FileSink, ReplySink
from gateway.edge.errors import ChannelError
from gateway.edge.messages import OutboundFile


class NoticeFirst:
    """Wraps a :class:`ReplySink` so that ``notice`` precedes everything it shows."""

    def __init__(self, sink: ReplySink, notice: str) -> None:
        self.sink = sink
        self.prefix = notice + "\n\n"
        self._shown = False

    async def typing(self) -> None:
        await self.sink.typing()

    async def delta(self, text: str) -> None:
        if not self._shown:
            self._shown = True
            text = self.prefix + text
        await self.sink.delta(text)

    async def finish(self, text: str) -> None:
        await self.sink.finish(self.prefix + text)

    async def fail(self, text: str) -> None:
        await self.sink.fail(self.prefix + text)

    async def send_file(self, file: OutboundFile) -> None:
        if not isinstance(self.sink, FileSink):
            raise ChannelError("this channel cannot send files")
        await self.sink.send_file(file)


def with_notice(sink: ReplySink, notice: str | None) -> ReplySink:
    """``sink`` itself when there is nothing to tell, else wrapped."""
    return sink if not notice else NoticeFirst(sink, notice)
