"""Attachments through the core: taken in before recording, expanded at send time, refused
with one clear recorded reply, and replayed byte-equal from the same blob store."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.edge.errors import TranscriptionError
from gateway.edge.messages import Attachment
from gateway.media.policy import MediaLimits
from providers.offline import OfflineTranscriber
from sessions.blob_files import FileBlobStore
from sessions.blobs import load
from sessions.errors import BlobWriteError
from sessions.jsonl import JsonlSessionStore
from sessions.replay import Replay
from tests.fakes import media
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.harness import Core, running_core

PHOTO = media.jpeg(120, 90)


class FailingTranscriber:
    model = "broken"

    async def transcribe(self, audio: bytes, media_type: str, name: str) -> str:
        raise TranscriptionError("server said no", kind="http_500")

    async def aclose(self) -> None:
        return None


class FullBlobStore(FileBlobStore):
    """A blob store whose disk is full: every put fails like the real one would."""

    async def put(self, tenant: str, data: bytes) -> str:
        raise BlobWriteError("ENOSPC")


@asynccontextmanager
async def core(tmp_path: Path, provider: ScriptedProvider, **options: Any) -> AsyncIterator[Core]:
    store = JsonlSessionStore(tmp_path / "data", durability="none")
    options.setdefault("blobs", FileBlobStore(tmp_path / "data"))
    options.setdefault("prompt_cache", False)  # bodies compared block for block, unmarked
    async with running_core(store, provider, tmp_path / "persona", **options) as c:
        yield c


async def session_of(c: Core) -> Replay:
    sessions = await c.store.list_sessions()
    assert len(sessions) == 1
    return await c.replay(sessions[0].session_id)


async def replayed(c: Core, replay: Replay, number: int, shape: str) -> dict[str, Any]:
    turn = replay.call(number)
    blobs = FileBlobStore(c.store.data_dir)  # type: ignore[attr-defined]
    return replay.request(turn, shape, await load(blobs, "default", replay.attachments(turn)))  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", ["anthropic", "openai"])
async def test_photo_with_caption_is_stored_once_sent_and_replayed(
    tmp_path: Path, shape: str
) -> None:
    """The photo goes to the blob store, the log holds its reference, the provider gets the
    image, replay rebuilds the same body; the same photo again is stored once."""
    provider = ScriptedProvider(shape=shape)  # type: ignore[arg-type]
    async with core(tmp_path, provider) as c:
        for _ in range(2):
            await c.channel.say("chat", "what is this?",
                                attachments=(Attachment("IMG_1.jpg", "image/jpeg", PHOTO,
                                                        kind="photo"),))
        await c.channel.wait_replies(2)
        replay = await session_of(c)
    digest = hashlib.sha256(PHOTO).hexdigest()
    blobs = await FileBlobStore(tmp_path / "data").list_blobs("default")
    assert [(b.hash, b.size) for b in blobs] == [(digest, len(PHOTO))]
    assert replay.messages[0]["content"] == [
        {"type": "attachment", "hash": digest, "name": "IMG_1.jpg",
         "media_type": "image/jpeg", "size": len(PHOTO)},
        {"type": "text", "text": "what is this?"},
    ]
    log = await c.store.read_log("default", replay.session_id)
    assert base64.b64encode(PHOTO)[:40] not in log  # never base64 inside the log
    data = base64.b64encode(PHOTO).decode()
    first = provider.bodies[0]["messages"][0 if shape == "anthropic" else 1]["content"]
    if shape == "anthropic":
        assert first[0] == {"type": "image", "source": {"type": "base64",
                                                        "media_type": "image/jpeg", "data": data}}
    else:
        assert first[0] == {"type": "image_url",
                            "image_url": {"url": f"data:image/jpeg;base64,{data}"}}
    for number, body in enumerate(provider.bodies, start=1):
        assert await replayed(c, replay, number, shape) == body


async def test_oversize_file_alone_gets_one_recorded_notice_and_no_call(tmp_path: Path) -> None:
    """A file over the limit and no text: the notice is the reply, recorded in meta; the
    message records a note where the file was; the provider is not called."""
    provider = ScriptedProvider()
    async with core(tmp_path, provider, limits=MediaLimits(max_bytes=1000)) as c:
        await c.channel.say("chat", "", attachments=(
            Attachment("scan.pdf", "application/pdf", media.PDF * 20),))
        replies = await c.channel.wait_replies(1)
        replay = await session_of(c)
    sentence = "I couldn't use scan.pdf: it is 2.8 KB, over the 1000 bytes limit."
    assert replies == [("chat", "finish", sentence)]
    assert provider.bodies == []
    entry = replay.messages.entry(0)
    assert entry["meta"]["notice"] == sentence
    assert entry["message"]["content"] == [{
        "type": "text",
        "text": "[attachment scan.pdf was not passed on: it is 2.8 KB, over the 1000 bytes limit]"}]
    assert await FileBlobStore(tmp_path / "data").list_blobs("default") == []


async def test_refusal_and_answer_share_one_reply(tmp_path: Path) -> None:
    """Text plus one file too many: the answer comes after the notice, in one reply; the model
    sees the accepted files and a note about the refused one."""
    provider = ScriptedProvider()
    provider.script("Two documents, got them.")
    async with core(tmp_path, provider, limits=MediaLimits(max_count=2)) as c:
        await c.channel.say("chat", "compare these", attachments=(
            Attachment("a.pdf", "application/pdf", media.PDF),
            Attachment("b.md", "text/markdown", media.NOTES_MD),
            Attachment("c.pdf", "application/pdf", media.PDF + b"%"),
        ))
        replies = await c.channel.wait_replies(1)
    assert replies == [("chat", "finish",
                        "I couldn't use c.pdf: only 2 attachments per message are read.\n\n"
                        "Two documents, got them.")]
    sent = provider.bodies[0]["messages"][0]["content"]
    assert [b["type"] for b in sent] == ["document", "text", "text", "text"]
    assert sent[1]["text"].startswith('<file name="b.md" media_type="text/markdown">')
    assert sent[2:] == [{"type": "text", "text": "compare these"},
                        {"type": "text", "text": "[attachment c.pdf was not passed on: only 2 "
                                                 "attachments per message are read]"}]


async def test_lying_media_type_is_judged_by_the_bytes(tmp_path: Path) -> None:
    """A "photo.jpg" claimed as image/jpeg that is a PDF is sent as a PDF; a claimed PDF that
    is a zip archive is refused."""
    provider = ScriptedProvider(shape="openai")
    async with core(tmp_path, provider) as c:
        await c.channel.say("chat", "look", attachments=(
            Attachment("photo.jpg", "image/jpeg", media.PDF, kind="photo"),
            Attachment("report.pdf", "application/pdf", media.ZIP, kind="document"),
        ))
        replies = await c.channel.wait_replies(1)
        replay = await session_of(c)
    assert replay.messages[0]["content"][0]["media_type"] == "application/pdf"
    part = provider.bodies[0]["messages"][1]["content"][0]
    assert part["type"] == "file"
    assert part["file"]["filename"] == "photo.jpg"
    assert replies[0][2].startswith(
        "I couldn't use report.pdf: it is of type application/zip, which I can't read.\n\n")


async def test_voice_without_transcription_is_one_clear_sentence(tmp_path: Path) -> None:
    """No transcriber configured: voice is refused with the one sentence, no call is made."""
    provider = ScriptedProvider()
    async with core(tmp_path, provider) as c:
        await c.channel.say("chat", "", attachments=(
            Attachment("voice.ogg", "audio/ogg", media.OGG_VOICE, kind="voice"),))
        replies = await c.channel.wait_replies(1)
    assert replies == [("chat", "finish",
                        "Voice messages are not enabled here, so I couldn't listen to voice.ogg.")]
    assert provider.bodies == []


async def test_voice_note_is_transcribed_and_the_transcript_recorded(tmp_path: Path) -> None:
    """The transcript is recorded with a reference to the audio blob and sent as text."""
    provider = ScriptedProvider()
    async with core(tmp_path, provider, transcriber=OfflineTranscriber()) as c:
        await c.channel.say("chat", "", attachments=(
            Attachment("voice.ogg", "audio/ogg", media.OGG_VOICE, kind="voice"),))
        await c.channel.wait_replies(1)
        replay = await session_of(c)
    block = replay.messages[0]["content"][0]
    transcript = await OfflineTranscriber().transcribe(media.OGG_VOICE, "audio/ogg", "voice.ogg")
    assert block == {"type": "attachment", "hash": hashlib.sha256(media.OGG_VOICE).hexdigest(),
                     "name": "voice.ogg", "media_type": "audio/ogg",
                     "size": len(media.OGG_VOICE), "transcript": transcript}
    assert provider.bodies[0]["messages"][0]["content"] == [{
        "type": "text",
        "text": f'<transcript of="voice.ogg" media_type="audio/ogg">\n{transcript}\n</transcript>'}]
    assert await replayed(c, replay, 1, "anthropic") == provider.bodies[0]


async def test_faults_refuse_the_file_with_a_notice(tmp_path: Path) -> None:
    """A failed transcription or a full blob store refuses that file, said plainly; nothing
    crashes and the text still gets its answer."""
    provider = ScriptedProvider()
    async with core(tmp_path, provider, transcriber=FailingTranscriber(),
                    blobs=FullBlobStore(tmp_path / "data")) as c:
        await c.channel.say("chat", "hello", attachments=(
            Attachment("voice.ogg", "audio/ogg", media.OGG_VOICE, kind="voice"),
            Attachment("p.png", "image/png", media.png()),
        ))
        replies = await c.channel.wait_replies(1)
    assert replies == [("chat", "finish",
                        "I couldn't use voice.ogg: it could not be transcribed just now.\n"
                        "I couldn't use p.png: it could not be stored just now.\n\nok")]


async def test_missing_blob_at_send_time_apologises_without_recording_a_call(
    tmp_path: Path
) -> None:
    """If a stored photo vanished before the call, no call is made or recorded; the person
    gets the apology (replay never shows a call that was not sent)."""
    provider = ScriptedProvider()
    blobs = FileBlobStore(tmp_path / "data")
    async with core(tmp_path, provider, blobs=blobs) as c:
        await c.channel.say("chat", "first", attachments=(Attachment("p.png", "image/png",
                                                                     media.png()),))
        await c.channel.wait_replies(1)
        await blobs.delete("default", [hashlib.sha256(media.png()).hexdigest()])
        await c.channel.say("chat", "second")
        replies = await c.channel.wait_replies(2)
        replay = await session_of(c)
    assert replies[1][1] == "fail"
    assert len(provider.bodies) == 1
    assert len(replay.calls) == 1


async def test_damaged_blob_at_send_time_is_refused_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stored photo whose bytes were damaged before the next call: nothing is sent or
    recorded (the damaged bytes never reach the provider), the person gets the apology and
    the log names the blob's hash."""
    provider = ScriptedProvider()
    blobs = FileBlobStore(tmp_path / "data")
    digest = hashlib.sha256(media.png()).hexdigest()
    async with core(tmp_path, provider, blobs=blobs) as c:
        await c.channel.say("chat", "first", attachments=(Attachment("p.png", "image/png",
                                                                     media.png()),))
        await c.channel.wait_replies(1)
        await asyncio.to_thread(blobs.path_of("default", digest).write_bytes, b"damaged")
        await c.channel.say("chat", "second")
        replies = await c.channel.wait_replies(2)
        replay = await session_of(c)
    assert replies[1][1] == "fail"
    assert len(provider.bodies) == len(replay.calls) == 1
    assert any(f"blob sha256 {digest} is damaged" in r.getMessage() for r in caplog.records)
