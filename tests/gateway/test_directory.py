"""The channel directory finds a channel by name for replies, refusals and downloads."""

from __future__ import annotations

import logging

import pytest

from gateway.delivery.directory import ChannelDirectory
from gateway.edge.messages import Attachment, ConversationKey, Inbound, Sender
from tests.fakes.memory_channel import MemoryChannel


class FetchingChannel(MemoryChannel):
    """A memory channel that downloads files handed in by reference (as Slack's does)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.fetched: list[str] = []

    async def fetch_file(self, attachment: Attachment) -> Attachment:
        self.fetched.append(attachment.name)
        return Attachment(attachment.name, attachment.media_type, b"bytes", size=5)


def inbound(channel: str, chat: str = "c1") -> Inbound:
    return Inbound(key=ConversationKey(channel, chat, "default"), sender=Sender("u", "u"),
                   text="hi")


async def test_replies_and_notices_go_to_the_inbound_messages_channel() -> None:
    """A reply sink and a notice reach the channel named by the message's key; the other
    channel hears nothing."""
    web, chat = MemoryChannel("web"), MemoryChannel("chat")
    directory = ChannelDirectory([web, chat])
    await directory.sink_for(inbound("chat", "c1")).finish("answer")
    await directory.notify(inbound("chat", "c2"), "not allowed", None)
    await directory.notify(inbound("chat", "c3"), "on the given sink",
                           web.reply_sink(inbound("web", "w1")))
    assert chat.replies == [("c1", "finish", "answer"), ("c2", "finish", "not allowed")]
    assert web.replies == [("w1", "finish", "on the given sink")]
    assert list(directory) == [web, chat]


def test_a_message_of_no_known_channel_is_a_lookup_error() -> None:
    """A reply for a channel the gateway does not run is a wiring bug, said by name."""
    directory = ChannelDirectory([MemoryChannel("web")])
    with pytest.raises(LookupError, match="'slack'"):
        directory.sink_for(inbound("slack"))


async def test_files_are_fetched_by_the_named_channel_or_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    """A file handed in by reference is downloaded by the channel of that name; a channel
    that cannot fetch (or none of that name) gives it back refused, with one warning each."""
    slack = FetchingChannel("slack")
    directory = ChannelDirectory([MemoryChannel("web"), slack])
    ref = Attachment("a.jpg", "image/jpeg", kind="file", ref={"url": "https://f/a.jpg"})
    fetched = await directory.fetch_file("slack", ref)
    with caplog.at_level(logging.WARNING, logger="gateway.delivery.directory"):
        refused = [await directory.fetch_file(name, ref) for name in ("web", "telegram")]
    assert (slack.fetched, fetched.data, fetched.problem) == (["a.jpg"], b"bytes", None)
    assert [a.problem for a in refused] == ["download-failed", "download-failed"]
    assert [r.getMessage() for r in caplog.records] == [
        "no channel named 'web' fetches files; one is not downloaded",
        "no channel named 'telegram' fetches files; one is not downloaded",
    ]
