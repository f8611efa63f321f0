"""Telegram files are downloaded as the message's turn starts, after the update is confirmed:
the real gateway and PTB against the fake Bot API, whose file host holds downloads until the
test lets them go (no timing: what happened while one was held is looked at, then released).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson

from tests.channels.test_telegram_harness import (
    ALICE,
    BOB,
    replay_of,
    running,
    settled,
    telegram_settings,
    turns,
    wait_until,
)
from tests.channels.test_telegram_webhook import SECRET, url_of, webhook_env
from tests.fakes import media
from tests.fakes.scripted_provider import ScriptedProvider
from tests.fakes.telegram_api import FakeTelegramServer

PHOTO = media.jpeg(320, 240)
BOUND = 10.0
"""Seconds a test waits for something that must happen while a download is held: only ends a
failing run (with the download before the confirmation it never happens)."""


def image_of(body: dict[str, Any]) -> list[str]:
    """The base64 data of the image blocks in a request body's last message."""
    return [block["source"]["data"] for block in body["messages"][-1]["content"]
            if isinstance(block, dict) and block.get("type") == "image"]


def owed_lines(data_dir: Path) -> list[list[object]]:
    """The owed journal's lines."""
    path = data_dir / "state" / "delivery.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line]


def photo_path(tg: FakeTelegramServer, update: dict[str, Any]) -> str:
    """Where the fake serves the full size of the update's photo."""
    return tg.file_ids[update["message"]["photo"][-1]["file_id"]][0]


async def test_a_held_download_does_not_hold_another_chats_message(tmp_path: Path) -> None:
    """While Alice's photo is still downloading, Bob's text is answered (before the fix the
    poller waited for the download, and no getUpdates brought Bob's message in)."""
    async with FakeTelegramServer() as tg, running(telegram_settings(tg, tmp_path)) as gateway:
        tg.file_hold.close()
        tg.user_media(ALICE, "photo", PHOTO, caption="what is this?")
        await wait_until(lambda: tg.file_hold.waiting == 1)
        tg.user_message(BOB, "hello")
        await settled(gateway, 1, timeout=BOUND)
        while_held = (tg.texts_to(ALICE), tg.texts_to(BOB), list(tg.downloads))
        tg.file_hold.open()
        await settled(gateway, 2)
    assert while_held == ([], ["ok"], [])
    assert tg.texts_to(ALICE) == ["ok"]


async def test_the_held_message_is_confirmed_then_answered_with_its_photo(
        tmp_path: Path) -> None:
    """The update is confirmed (offset past it) while its download is held, and owed with the
    file's reference only; released, the turn downloads it once and the provider gets the
    photo, recorded in the session as an attachment reference."""
    provider = ScriptedProvider()
    provider.script("A cat.")
    async with FakeTelegramServer() as tg, running(telegram_settings(tg, tmp_path),
                                                   provider) as gateway:
        tg.file_hold.close()
        update = tg.user_media(ALICE, "photo", PHOTO, caption="what is this?")
        await wait_until(lambda: tg.file_hold.waiting == 1)
        await wait_until(lambda: tg.confirmed_offset > update["update_id"], BOUND)
        while_held = (turns(gateway), len(provider.bodies),
                      sum(i.message_count for i in await gateway.store.list_sessions("default")))
        tg.file_hold.open()
        await settled(gateway, 1)
        replay = await replay_of(gateway, f"telegram:{ALICE}")
    assert while_held == (0, 0, 0)  # owed in the journal only: not in its session yet
    [body] = provider.bodies
    assert image_of(body) == [base64.b64encode(PHOTO).decode()]
    assert tg.texts_to(ALICE) == ["A cat."]
    assert tg.downloads == [photo_path(tg, update)]
    [user] = [m for m in replay.messages if m["role"] == "user"]
    assert [b["type"] for b in user["content"]] == ["attachment", "text"]


async def test_a_download_failing_after_the_confirmation_is_told(tmp_path: Path) -> None:
    """A download that fails after the update was confirmed (the file host errs) is not
    silence: the reply says the file could not be downloaded, then answers the caption."""
    async with FakeTelegramServer() as tg, running(telegram_settings(tg, tmp_path)) as gateway:
        tg.file_hold.close()
        update = tg.user_media(ALICE, "photo", PHOTO, caption="look")
        await wait_until(lambda: tg.file_hold.waiting == 1)
        await wait_until(lambda: tg.confirmed_offset > update["update_id"], BOUND)
        tg.file_hold.drop()  # answered 502
        await settled(gateway, 1)
    assert tg.texts_to(ALICE) == ["I couldn't use photo.jpg: it could not be downloaded.\n\nok"]
    assert tg.downloads == []


async def test_a_stop_while_held_leaves_the_file_owed_for_the_next_start(
        tmp_path: Path) -> None:
    """Stopped after the confirmation, with the download still held: the owed journal keeps
    the file's reference (never its bytes), and the next start downloads it and answers with
    it, once (Telegram does not deliver the confirmed update again)."""
    first_provider, second_provider = ScriptedProvider(), ScriptedProvider()
    second_provider.script("A cat, after the restart.")
    async with FakeTelegramServer() as tg:
        settings = telegram_settings(tg, tmp_path, GATEWAY_SHUTDOWN_GRACE=0)
        tg.file_hold.close()
        async with running(settings, first_provider):
            update = tg.user_media(ALICE, "photo", PHOTO, caption="and this?")
            await wait_until(lambda: tg.file_hold.waiting == 1)
            await wait_until(lambda: tg.confirmed_offset > update["update_id"], BOUND)
        owed = [line for line in owed_lines(tmp_path) if line[0] == "owe"]
        tg.file_hold.drop()  # the first run's request never got its file
        async with running(settings, second_provider) as second:
            await settled(second, 1)
            replay = await replay_of(second, f"telegram:{ALICE}")
    assert first_provider.bodies == []
    [(_, _, _, _, _, item)] = owed
    assert isinstance(item, str)
    wire = orjson.loads(item.partition(" ")[2])
    largest = update["message"]["photo"][-1]
    assert wire["attachments"] == [{
        "name": "photo.jpg", "media_type": "image/jpeg", "kind": "photo",
        "size": largest["file_size"], "problem": None, "ref": {"file_id": largest["file_id"]}}]
    [body] = second_provider.bodies
    assert image_of(body) == [base64.b64encode(PHOTO).decode()]
    assert tg.texts_to(ALICE) == ["A cat, after the restart."]
    assert [m["role"] for m in replay.messages] == ["user", "assistant"]  # recorded once
    assert tg.downloads == [photo_path(tg, update)]


async def test_the_webhook_answers_while_the_download_is_held(tmp_path: Path) -> None:
    """In webhook mode the 200 comes while the file is still held (before the fix it waited
    for the download); the turn then answers with the photo."""
    provider = ScriptedProvider()
    async with FakeTelegramServer() as tg, running(
            telegram_settings(tg, tmp_path, **webhook_env()), provider) as gateway:
        tg.file_hold.close()
        update = tg.user_media(ALICE, "photo", PHOTO, caption="what is this?")
        status, _ = await tg.deliver_webhook(url_of(gateway), update, secret=SECRET,
                                             timeout=BOUND)
        await wait_until(lambda: tg.file_hold.waiting == 1)
        answered_while_held = tg.texts_to(ALICE)
        tg.file_hold.open()
        await settled(gateway, 1)
    assert status == 200
    assert answered_while_held == []
    [body] = provider.bodies
    assert image_of(body) == [base64.b64encode(PHOTO).decode()]
    assert tg.texts_to(ALICE) == ["ok"]


async def test_get_files_size_is_checked_before_downloading(tmp_path: Path) -> None:
    """An update that understates its file's size (1,000 bytes for 2 MiB) is refused by the
    size ``getFile`` answers: nothing is downloaded, the person is told how large it is."""
    async with FakeTelegramServer() as tg, running(telegram_settings(
            tg, tmp_path, GATEWAY_MAX_ATTACHMENT_BYTES=1024 * 1024)) as gateway:
        tg.user_media(ALICE, "document", b"a" * (2 * 1024 * 1024), file_name="notes.txt",
                      mime_type="text/plain", declared_size=1000, caption="read this")
        await settled(gateway, 1)
    assert tg.texts_to(ALICE) == [
        "I couldn't use notes.txt: it is 2.0 MB, over the 1.0 MB limit.\n\nok"]
    assert (len(tg.file_lookups), tg.downloads) == (1, [])


async def test_a_download_stops_reading_at_the_cap(tmp_path: Path) -> None:
    """A file whose size nobody states (no ``file_size`` from ``getFile``, 1,000 bytes in the
    update) that streams 256 MiB is refused as too large once it passes the 1 MiB cap: the
    download stops there instead of reading it whole (what went out before the gateway hung
    up is bounded by socket buffers, far below the file)."""
    size = 256 * 1024 * 1024
    async with FakeTelegramServer() as tg, running(telegram_settings(
            tg, tmp_path, GATEWAY_MAX_ATTACHMENT_BYTES=1024 * 1024)) as gateway:
        file = tg.add_unsized_file(size)
        tg.user_media(ALICE, "document", b"", file=file, file_name="endless.bin",
                      declared_size=1000, caption="read this")
        await settled(gateway, 1)
        await wait_until(lambda: bool(tg.streamed), BOUND)
    assert tg.texts_to(ALICE) == [
        "I couldn't use endless.bin: it is over the 1.0 MB limit.\n\nok"]
    [sent] = tg.streamed.values()
    assert sent < size // 4
