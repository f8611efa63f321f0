"""The channel directory: the running gateway's channels, found by name.

The composition root builds it from the channels it chose, before the parts that need to
reach a channel again in the middle of a message's way: the router and its item server (where
a reply goes: :meth:`ChannelDirectory.sink_for`), the media intake (which channel downloads a
file handed in by reference: :meth:`ChannelDirectory.fetch_file`) and the access gate (where a
refusal or a pairing code is said: :meth:`ChannelDirectory.notify`). They get its bound
methods, so none of them knows the others, the server or the shell.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator

from gateway.edge.channel import Channel, FetchChannel, ReplySink
from gateway.edge.messages import Attachment, Inbound

log = logging.getLogger(__name__)


class ChannelDirectory:
    """The channels by name (the first of a name, as listed, when two share one)."""

    def __init__(self, channels: Iterable[Channel]) -> None:
        self.channels = tuple(channels)
        self._by_name: dict[str, Channel] = {}
        for channel in self.channels:
            self._by_name.setdefault(channel.name, channel)

    def __iter__(self) -> Iterator[Channel]:
        return iter(self.channels)

    def __len__(self) -> int:
        return len(self.channels)

    def named(self, name: str) -> Channel | None:
        """The channel of that name (``None``: the gateway runs none)."""
        return self._by_name.get(name)

    def sink_for(self, inbound: Inbound) -> ReplySink:
        """Where the reply to ``inbound`` goes: its channel's sink (``LookupError`` when no
        channel has its name, a wiring bug)."""
        channel = self._by_name.get(inbound.key.channel)
        if channel is None:
            raise LookupError(f"no channel named {inbound.key.channel!r}")
        return channel.reply_sink(inbound)

    async def notify(self, inbound: Inbound, text: str, sink: ReplySink | None) -> None:
        """Say ``text`` as the whole reply to ``inbound``, on ``sink`` or its channel's."""
        await (sink or self.sink_for(inbound)).finish(text)

    async def fetch_file(self, channel_name: str, attachment: Attachment) -> Attachment:
        """Download a file the named channel handed in as a reference (a Slack or Telegram
        file, as its message's turn starts); one no channel here can fetch comes back
        refused."""
        channel = self._by_name.get(channel_name)
        if isinstance(channel, FetchChannel):
            return await channel.fetch_file(attachment)
        log.warning("no channel named %r fetches files; one is not downloaded", channel_name)
        return dataclasses.replace(attachment, problem="download-failed")
