"""Files fetched after the acknowledgement (an attachment with a ``ref``, as Slack hands them
in): owed as references, downloaded and stored as the turn starts, and answered once across a
stop, whether it came before the download or after the message was recorded with them."""

from __future__ import annotations

import asyncio
import errno
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from coordination.journal import FileJournal
from coordination.keys import decode_item, encode_item
from coordination.local import LocalConversations
from gateway.edge.coordination import QueueItem
from gateway.edge.messages import Attachment, ConversationKey, Inbound, Sender, deferred
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from gateway.media.images import IMAGE_LIMITS
from gateway.media.intake import MediaIntake
from gateway.media.policy import MediaLimits
from sessions.blob_files import FileBlobStore
from sessions.jsonl import JsonlSessionStore
from tests.fakes import media
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import running_core
from tests.waiting import WAIT, until

PHOTO = media.jpeg(120, 90)
KEY = ConversationKey("memory", "a")


def ref(name: str) -> Attachment:
    """A file handed in as a reference, as the Slack channel does."""
    return Attachment(name, "image/jpeg", kind="file", size=len(PHOTO),
                      ref={"url": f"https://files.example/{name}"})


class Files:
    """The channel's side: serves a ref'd file's bytes (``gone`` ones fail), counting calls;
    with ``hold`` set, every fetch waits until it is."""

    def __init__(self, gone: frozenset[str] = frozenset()) -> None:
        self.gone = gone
        self.fetched: list[str] = []
        self.hold: asyncio.Event | None = None

    async def fetch(self, channel: str, attachment: Attachment) -> Attachment:
        assert attachment.ref is not None
        self.fetched.append(f"{channel}:{attachment.ref['url']}")
        if self.hold is not None:
            await self.hold.wait()
        if attachment.name in self.gone:
            return Attachment(attachment.name, attachment.media_type, kind=attachment.kind,
                              problem="download-failed")
        return Attachment(attachment.name, attachment.media_type, PHOTO, kind=attachment.kind,
                          size=len(PHOTO))


class Held(ScriptedProvider):
    """A scripted provider whose calls wait while ``hold`` is set; ``called`` is set by the
    first one."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: asyncio.Event | None = None
        self.called = asyncio.Event()

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        self.called.set()
        if self.hold is not None:
            await self.hold.wait()
        return await super().complete(request, on_text)


def queue(tmp_path: Path) -> LocalConversations:
    return LocalConversations(FileJournal(tmp_path / "d" / "state" / "delivery.jsonl"))


def durable_core(tmp_path: Path, provider: ScriptedProvider,
                 files: Files) -> AbstractAsyncContextManager[Any]:
    """A core whose sessions, blobs and owed journal live under ``tmp_path``: started again
    on the same directory, it is the next start of the same gateway."""
    return running_core(JsonlSessionStore(tmp_path / "d"), provider, tmp_path / "p",
                        blobs=FileBlobStore(tmp_path / "d"), fetch=files.fetch,
                        conversations=queue(tmp_path))


def image_blocks(provider: ScriptedProvider) -> list[list[str]]:
    """The block types of each call's last message."""
    return [[b["type"] for b in body["messages"][-1]["content"]] for body in provider.bodies]


async def test_accepted_before_the_fetch_and_recorded_once_taken_in(tmp_path: Path) -> None:
    """``deliver`` returns (the channel acknowledges) while the fetch is still held; nothing is
    in the session until the file is taken in, and the model then sees it."""
    files, provider = Files(), ScriptedProvider()
    files.hold = asyncio.Event()
    store = JsonlSessionStore(tmp_path / "d", durability="none")
    async with running_core(store, provider, tmp_path / "p", blobs=FileBlobStore(tmp_path / "d"),
                            fetch=files.fetch, prompt_cache=False) as core:
        accepted = await core.channel.say("a", "what is it?", attachments=(ref("cat.jpg"),))
        await until(lambda: files.fetched)
        conv = core.registry.peek(KEY)
        while_held = (list(conv.messages) if conv is not None else None,
                      list(core.channel.replies))
        files.hold.set()
        replies = await core.channel.wait_replies(1)
        await core.idle()
    assert accepted is not None
    assert accepted.session_id is None  # recorded only as its turn starts
    assert while_held == ([], [])
    assert files.fetched == ["memory:https://files.example/cat.jpg"]
    assert replies == [("a", "finish", "ok")]
    assert image_blocks(provider) == [["image", "text"]]


async def test_a_stop_before_the_fetch_fetches_on_the_next_start(tmp_path: Path) -> None:
    """Stopped while the fetch is held: the journal still owes the message with its
    reference, and the next start fetches it and answers with it."""
    files, provider = Files(), ScriptedProvider()
    files.hold = asyncio.Event()
    async with durable_core(tmp_path, provider, files) as core:
        await core.channel.say("a", "what is it?", attachments=(ref("cat.jpg"),))
        await until(lambda: files.fetched)
        await core.router.drain(0)
    assert core.channel.replies == []
    files.hold = None
    async with durable_core(tmp_path, provider, files) as again:
        replies = await again.channel.wait_replies(1)
        await again.idle()
    assert replies == [("a", "finish", "ok")]
    assert files.fetched == ["memory:https://files.example/cat.jpg"] * 2
    assert image_blocks(provider) == [["image", "text"]]


async def test_a_stop_after_the_files_were_recorded_does_not_fetch_them_again(
        tmp_path: Path) -> None:
    """Stopped mid-call, after the message was recorded with one file taken in and one that
    could not be downloaded: the next start finishes the turn from the log (no new fetch),
    and the reply still begins with the sentence about the file that failed."""
    files, provider = Files(gone=frozenset({"b.jpg"})), Held()
    provider.hold = asyncio.Event()
    async with durable_core(tmp_path, provider, files) as core:
        await core.channel.say("a", "compare", attachments=(ref("a.jpg"), ref("b.jpg")))
        await asyncio.wait_for(provider.called.wait(), WAIT)
        await core.router.drain(0)
    assert core.channel.replies == []
    provider.hold = None
    async with durable_core(tmp_path, provider, files) as again:
        replies = await again.channel.wait_replies(1)
        await again.idle()
    assert replies == [("a", "finish",
                        "I couldn't use b.jpg: it could not be downloaded.\n\nok")]
    assert len(files.fetched) == 2  # the first run's two, none after the restart
    assert image_blocks(provider)[-1][0] == "image"  # the recorded file, sent again


def test_deferred_attachments_travel_as_references() -> None:
    """The wire form of an owed item keeps a deferred message's files (refs, refusals) and
    gives them back as they were."""
    inbound = Inbound(KEY, Sender("u"), "look", platform_id="p1", attachments=(
        ref("cat.jpg"), Attachment("big.iso", kind="file", size=10**9, problem="too-large")))
    wire = decode_item(encode_item(QueueItem(inbound, id="i1"), ""))
    assert wire.item.inbound.attachments == inbound.attachments
    assert deferred(wire.item.inbound)


async def test_a_fetch_that_cannot_be_made_is_a_notice(tmp_path: Path) -> None:
    """No channel to fetch with, or a fetcher that raises: the file is refused with the
    download sentence, never an error for the turn."""

    async def broken(channel: str, attachment: Attachment) -> Attachment:
        raise RuntimeError("a fetcher's bug")

    blobs = FileBlobStore(tmp_path / "d")
    inbound = Inbound(KEY, Sender("u"), "", attachments=(ref("cat.jpg"),))
    notices = []
    for fetch in (None, broken):
        intake = MediaIntake(blobs, limits=MediaLimits(), images=IMAGE_LIMITS["anthropic"],
                             transcriber=None, fetch=fetch)
        taken = await intake.prepare(inbound)
        notices.append((taken.attachments, taken.notice))
    assert notices == [((), "I couldn't use cat.jpg: it could not be downloaded.")] * 2


async def test_a_message_behind_one_with_files_to_fetch_is_recorded_after_it(
        tmp_path: Path) -> None:
    """A text that comes while the message before it (same conversation) still has its files
    to fetch waits to be recorded after it, so the session holds them in the order they were
    sent (before: the text was recorded on receipt, ahead of the message with the file); a
    message after both are answered is recorded on receipt again."""
    files, provider = Files(), ScriptedProvider()
    files.hold = asyncio.Event()
    store = JsonlSessionStore(tmp_path / "d", durability="none")
    async with running_core(store, provider, tmp_path / "p", blobs=FileBlobStore(tmp_path / "d"),
                            fetch=files.fetch, prompt_cache=False) as core:
        await core.channel.say("a", "what is it?", attachments=(ref("cat.jpg"),))
        await until(lambda: files.fetched)
        behind = await core.channel.say("a", "and then this")
        files.hold.set()
        await core.channel.wait_replies(2)
        await core.idle()
        after = await core.channel.say("a", "later")
        await core.channel.wait_replies(3)
        await core.idle()
        conv = core.registry.peek(KEY)
        assert conv is not None
        said = [(m["role"], m["content"] if isinstance(m["content"], str)
                 else [b.get("text", b["type"]) for b in m["content"]]) for m in conv.messages]
    assert behind is not None
    assert behind.session_id is None  # recorded as its turn starts
    assert after is not None
    assert after.session_id is not None  # on receipt, as before
    assert said == [("user", ["attachment", "what is it?"]), ("assistant", ["ok"]),
                    ("user", "and then this"), ("assistant", ["ok"]),
                    ("user", "later"), ("assistant", ["ok"])]


async def test_downloads_wait_for_a_download_slot_and_show_the_reply_coming(
        tmp_path: Path) -> None:
    """Files fetched as their turns start count against ``max_concurrent_downloads``: with
    one slot, the second conversation's download starts only once the first's is done. Each
    person sees the reply being prepared (typing) while their file downloads."""
    files, provider = Files(), ScriptedProvider()
    files.hold = asyncio.Event()
    store = JsonlSessionStore(tmp_path / "d", durability="none")
    async with running_core(store, provider, tmp_path / "p", blobs=FileBlobStore(tmp_path / "d"),
                            fetch=files.fetch, prompt_cache=False,
                            max_concurrent_downloads=1) as core:
        for chat in ("a", "b"):
            await core.channel.say(chat, "what is it?", attachments=(ref(f"{chat}.jpg"),))
        await until(lambda: files.fetched)
        for _ in range(100):  # room on the loop for a second download to start, were it
            await asyncio.sleep(0)  # allowed to (starting one takes no thread, only the loop)
        while_held = (list(files.fetched), list(core.channel.events))
        files.hold.set()
        replies = await core.channel.wait_replies(2)
        await core.idle()
    first = while_held[0][0].rsplit("/", 1)[1][0]  # the chat whose download went first
    assert len(while_held[0]) == 1
    assert while_held[1] == [(first, "typing", "")]
    assert sorted(replies) == [("a", "finish", "ok"), ("b", "finish", "ok")]
    assert len(files.fetched) == 2


class FullOnce(FileBlobStore):
    """A blob store whose first write finds the disk full."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.refused = 0

    async def put(self, tenant: str, data: bytes) -> str:
        if not self.refused:
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return await super().put(tenant, data)


async def test_a_download_that_cannot_be_stored_takes_the_indicator_back(
        tmp_path: Path) -> None:
    """The file cannot be stored (the disk is full): the typing indicator shown for the
    download is taken back, and the message is tried again later and answered once."""
    files, provider = Files(), ScriptedProvider()
    blobs = FullOnce(tmp_path / "d")
    store = JsonlSessionStore(tmp_path / "d", durability="none")
    async with running_core(store, provider, tmp_path / "p", blobs=blobs, fetch=files.fetch,
                            prompt_cache=False, retry_delay=0.01) as core:
        await core.channel.say("a", "what is it?", attachments=(ref("cat.jpg"),))
        replies = await core.channel.wait_replies(1)
        await core.idle()
    assert blobs.refused == 1
    assert core.channel.events[:3] == [("a", "typing", ""), ("a", "retract", ""),
                                       ("a", "typing", "")]
    assert replies == [("a", "finish", "ok")]
    assert files.fetched == ["memory:https://files.example/cat.jpg"] * 2
