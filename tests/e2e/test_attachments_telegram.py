"""Files through Telegram end to end: the real PTB against the fake Bot API (getFile and
downloads), the real provider SDKs against the fake provider servers (and the fake audio
transcription endpoint). Every body a provider received equals ``gateway replay --request N``,
images included; refusals are one clear reply; the same photo twice is stored once."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessions.blob_files import FileBlobStore
from sessions.replay import replay_bytes
from tests.channels.test_telegram_harness import ALICE, running, settled, telegram_settings
from tests.e2e.replaying import assert_shows_what_was_read, replay_cli
from tests.e2e.test_provider_replay import API, make_provider
from tests.fakes import media
from tests.fakes.providers import FakeProviderServer
from tests.fakes.telegram_api import FakeTelegramServer

PHOTO = media.jpeg(640, 480)
MB = 1024 * 1024


async def said(tg: FakeTelegramServer, text: str) -> None:
    """Wait until the bot showed ``text`` to Alice (replies without a turn: notices; like
    every answer, edited into a placeholder noted first)."""
    await tg.wait_for_sent(lambda c: c.method in ("sendMessage", "editMessageText")
                           and c.ok and c.text == text)


def every_request_replays(data_dir: Path, api: str, raws: list[bytes],
                          bodies: list[dict[str, Any]]) -> str:
    """The bytes of each provider request equal its replay (``--raw``: byte for byte, base64
    images included), call by call, in order, and each call shows the system prompt the model
    read; the session id."""
    code, listing = replay_cli(data_dir, "--list", "--json")
    assert code == 0
    [session] = orjson.loads(listing)
    assert assert_shows_what_was_read(data_dir, session["id"], received=bodies) == len(raws)
    replayed = []
    for number in range(1, len(raws) + 1):
        code, out = replay_cli(data_dir, session["id"], "--request", str(number), "--shape", api,
                               "--raw")
        assert code == 0
        replayed.append(out.encode())
    assert replayed == raws
    return str(session["id"])


@pytest.mark.parametrize("api", API)
async def test_photo_pdf_voice_oversize_and_lying_type(tmp_path: Path, api: str) -> None:
    """A photo with caption, a PDF, a voice note (transcribed), a file over 20 MB and a PDF
    named photo.jpg: each reaches the provider in the shape's own blocks (or is refused with
    one sentence), and replay rebuilds every body byte for byte."""
    data_dir = tmp_path / "data"
    async with FakeTelegramServer() as tg, FakeProviderServer() as srv:
        settings = telegram_settings(
            tg, data_dir, GATEWAY_TRANSCRIPTION_MODEL="whisper-1",
            OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="test-key-openai")
        async with running(settings, make_provider(api, srv)) as gateway:
            tg.user_media(ALICE, "photo", PHOTO, caption="what is in this picture?")
            await settled(gateway, 1)
            tg.user_media(ALICE, "document", media.PDF, file_name="report.pdf",
                          mime_type="application/pdf", caption="summarise it")
            await settled(gateway, 2)
            tg.user_media(ALICE, "voice", media.OGG_VOICE, mime_type="audio/ogg")
            await settled(gateway, 3)
            tg.user_media(ALICE, "document", b"PK\x03\x04", file_name="backup.zip",
                          mime_type="application/zip", declared_size=25 * MB)
            await said(tg, "I couldn't use backup.zip: it is 25.0 MB, over the 20.0 MB limit.")
            await settled(gateway, 4)  # answered by the notice alone: no provider call
            tg.user_media(ALICE, "document", media.PDF, file_name="photo.jpg",
                          mime_type="image/jpeg", caption="and this one?")
            await settled(gateway, 5)
            tg.user_media(ALICE, "photo", PHOTO, caption="same picture again")
            await settled(gateway, 6)
        bodies = [r.body for r in srv.requests_for(api)]
        raws = [r.raw for r in srv.requests_for(api)]
    assert len(bodies) == 5
    assert [t.model for t in srv.transcriptions] == ["whisper-1"]
    assert srv.transcriptions[0].data == media.OGG_VOICE
    # Only files that were used were downloaded; the 25 MB one never was.
    assert not any(path.endswith(".zip") for path in tg.downloads)

    photo_b64 = base64.b64encode(PHOTO).decode()
    pdf_b64 = base64.b64encode(media.PDF).decode()
    last = [m for m in bodies[-1]["messages"] if m["role"] == "user"]
    if api == "anthropic":
        image = {"type": "image",
                 "source": {"type": "base64", "media_type": "image/jpeg", "data": photo_b64}}
        document = {"type": "document", "source": {"type": "base64",
                                                   "media_type": "application/pdf",
                                                   "data": pdf_b64}}
        assert last[0]["content"] == [image, {"type": "text",
                                              "text": "what is in this picture?"}]
        assert last[1]["content"][0] == {**document, "title": "report.pdf"}
        voice_text = last[2]["content"][0]["text"]
        assert last[-2]["content"][0] == {**document, "title": "photo.jpg"}
    else:
        url = f"data:image/jpeg;base64,{photo_b64}"
        assert last[0]["content"][0] == {"type": "image_url", "image_url": {"url": url}}
        assert last[1]["content"][0] == {"type": "file", "file": {
            "filename": "report.pdf", "file_data": f"data:application/pdf;base64,{pdf_b64}"}}
        voice_text = last[2]["content"][0]["text"]
        assert last[-2]["content"][0]["file"]["filename"] == "photo.jpg"
    assert voice_text.startswith('<transcript of="voice.ogg" media_type="audio/ogg">\n'
                                 "transcribed voice.ogg")
    # The refused file is a note in the model's view, not a silent gap.
    texts = [t for m in last for t in ([m["content"]] if isinstance(m["content"], str) else
                                       [b.get("text", "") for b in m["content"]])]
    notes = [t for t in texts if t.startswith("[attachment")]
    assert notes == ["[attachment backup.zip was not passed on: it is 25.0 MB, over the 20.0 MB "
                     "limit]"]

    session = await asyncio.to_thread(every_request_replays, data_dir, api, raws, bodies)
    blobs = await FileBlobStore(data_dir).list_blobs("default")
    assert sorted(b.hash for b in blobs) == sorted(hashlib.sha256(d).hexdigest() for d in
                                                    (PHOTO, media.PDF, media.OGG_VOICE))
    log = (data_dir / "sessions" / f"{session}.jsonl").read_bytes()
    assert photo_b64[:64].encode() not in log
    replay = replay_bytes(log)
    notice = [replay.messages.entry(i).get("meta", {}).get("notice")
              for i in range(len(replay.messages))]
    assert [n for n in notice if n] == [
        "I couldn't use backup.zip: it is 25.0 MB, over the 20.0 MB limit."]


async def test_a_strangers_files_are_never_fetched(tmp_path: Path) -> None:
    """A person the gateway does not know sends a photo and a document: they get the pairing
    code, and the bot never asks Telegram for the files (no getFile, no download); once
    approved, the same kind of message is fetched and answered."""
    stranger = 4242
    async with FakeTelegramServer() as tg:
        async with running(telegram_settings(tg, tmp_path / "data")) as gateway:
            tg.user_media(stranger, "photo", PHOTO, caption="look at this")
            tg.user_media(stranger, "document", media.PDF, file_name="cv.pdf",
                          mime_type="application/pdf")
            await tg.wait_for_sent(lambda c: c.method == "sendMessage"
                                   and c.chat_id == stranger and "pairing" in (c.text or ""))
            tg.user_media(ALICE, "photo", PHOTO, caption="and mine?")
            await settled(gateway, 1)  # updates are handled in order: the stranger's are done
        lookups, downloads = list(tg.file_lookups), list(tg.downloads)
    assert len(lookups) == len(downloads) == 1  # Alice's photo only


SEND_CSV = {"role": "assistant", "content": [
    {"type": "text", "text": "Here is the table."},
    {"type": "tool_use", "id": "toolu_9", "name": "send_file",
     "input": {"name": "totals.csv", "content": "month,total\njan,3\nfeb,5\n"}}]}


async def test_send_file_arrives_as_a_document(tmp_path: Path) -> None:
    """The send_file tool delivers a document into the chat; the call is recorded with the
    file's hash, and its bytes are in the blob store."""
    from tests.fakes.scripted_provider import ScriptedProvider

    provider = ScriptedProvider()
    provider.script(SEND_CSV, "Sent it.")
    data_dir = tmp_path / "data"
    async with FakeTelegramServer() as tg:
        async with running(telegram_settings(tg, data_dir), provider) as gateway:
            tg.user_message(ALICE, "send me the totals as a file")
            await settled(gateway, 1)
        [(chat, document)] = tg.documents
    data = b"month,total\njan,3\nfeb,5\n"
    assert (chat, document.filename, document.data) == (ALICE, "totals.csv", data)
    assert tg.texts_to(ALICE)[-1] == "Here is the table.\n\nSent it."
    digest = hashlib.sha256(data).hexdigest()
    assert await FileBlobStore(data_dir).get("default", digest) == data
    code, listing = await asyncio.to_thread(replay_cli, data_dir, "--list", "--json")
    session = orjson.loads(listing)[0]["id"]
    code, turn = await asyncio.to_thread(replay_cli, data_dir, session, "--turn", "2")
    assert code == 0
    assert f"<sent file totals.csv text/csv {len(data)} bytes sha256:{digest}>" in turn
