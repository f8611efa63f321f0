"""The pure Update -> Inbound conversion: what counts as a message for the agent, and where."""

from __future__ import annotations

from typing import Any

import pytest
from telegram import Message, Update

from channels.telegram.convert import (
    TOO_LONG_NOTICE,
    UNSUPPORTED_NOTICE,
    BotIdentity,
    GroupMode,
    Skip,
    TelegramFile,
    files_of,
    to_inbound,
)
from channels.telegram.files import file_base_url
from gateway.edge.messages import Attachment, ConversationKey, Inbound, Sender
from tests.fakes.telegram_api import FakeTelegramServer

BOT = BotIdentity(id=123456789, username="fake_test_bot")
GROUP = -100777


@pytest.fixture
def tg() -> FakeTelegramServer:
    """The fake builds realistic Update JSON (entities, replies, topics); no server needed."""
    return FakeTelegramServer()


def convert(raw: dict[str, Any], *, group_mode: GroupMode = "mention",
            max_chars: int = 100) -> Inbound | Skip:
    return to_inbound(Update.de_json(raw, None), bot=BOT, group_mode=group_mode,
                      max_chars=max_chars, received_at=12.5)


def test_private_text(tg: FakeTelegramServer) -> None:
    """A DM becomes an Inbound keyed by chat, with the update id, sender and username."""
    raw = tg.user_message(42, "hello there", username="alice", first_name="Alice")
    inbound = convert(raw)
    assert inbound == Inbound(
        key=ConversationKey("telegram", "42"), sender=Sender("42", "Alice"), text="hello there",
        platform_id=str(raw["update_id"]), chat_type="private", received_at=12.5,
        meta={"chat_id": 42, "message_id": raw["message"]["message_id"], "username": "alice"},
    )


@pytest.mark.parametrize(
    ("text", "entities", "reply_to_bot", "expected"),
    [
        ("hello everyone", None, False, False),
        ("@fake_test_bot what's up", None, False, True),
        ("hey @FAKE_TEST_BOT", None, False, True),  # usernames are case-insensitive
        ("@other_bot_x hi", None, False, False),
        ("/ask@fake_test_bot now", None, False, True),
        ("/ask now", None, False, False),
        ("thanks", None, True, True),
        ("Bot, hi", [{"type": "text_mention", "offset": 0, "length": 3,
                      "user": {"id": BOT.id, "is_bot": True, "first_name": "Fake"}}], False,
         True),
        ("😀😀 @fake_test_bot", None, False, True),  # entity offsets count UTF-16 units
    ],
)
def test_group_mention_gating(tg: FakeTelegramServer, text: str,
                              entities: list[dict[str, Any]] | None, reply_to_bot: bool,
                              expected: bool) -> None:
    """In mention mode a group message counts only when it mentions or replies to the bot."""
    raw = tg.user_message(GROUP, text, chat_type="supergroup", entities=entities,
                          reply_to_bot=reply_to_bot)
    result = convert(raw)
    assert isinstance(result, Inbound) is expected
    if not expected:
        assert result == Skip("not-addressed")
    assert isinstance(convert(raw, group_mode="all"), Inbound)


def test_group_inbound_fields(tg: FakeTelegramServer) -> None:
    """A group message is keyed by the group; its sender is the person, chat type kept."""
    raw = tg.user_message(GROUP, "@fake_test_bot hi", chat_type="group", user_id=7,
                          username="bob")
    inbound = convert(raw)
    assert isinstance(inbound, Inbound)
    assert inbound.key == ConversationKey("telegram", str(GROUP))
    assert (inbound.sender.id, inbound.chat_type, inbound.meta["username"]) == ("7", "group",
                                                                                "bob")


def test_forum_topics_are_conversations(tg: FakeTelegramServer) -> None:
    """A topic message is keyed by chat and thread; the topic's opening message is no reply."""
    first = tg.user_message(GROUP, "@fake_test_bot a", chat_type="supergroup",
                            message_thread_id=11)
    second = tg.user_message(GROUP, "@fake_test_bot b", chat_type="supergroup",
                             message_thread_id=22)
    keys = [r.key for r in (convert(first), convert(second)) if isinstance(r, Inbound)]
    assert keys == [ConversationKey("telegram", str(GROUP), thread="11"),
                    ConversationKey("telegram", str(GROUP), thread="22")]

    raw = tg.user_message(GROUP, "no mention", chat_type="supergroup", message_thread_id=11)
    raw["message"]["reply_to_message"] = {
        "message_id": 11, "date": 0, "chat": raw["message"]["chat"],
        "from": {"id": BOT.id, "is_bot": True, "first_name": "Fake"},
        "forum_topic_created": {"name": "t", "icon_color": 0},
    }
    assert convert(raw) == Skip("not-addressed")


def test_bots_and_own_messages_skipped(tg: FakeTelegramServer) -> None:
    """The bot's own messages and other bots' never reach the agent."""
    own = tg.user_message(42, "echo", user_id=BOT.id)
    assert convert(own) == Skip("own-message")
    other = tg.user_message(42, "beep")
    other["message"]["from"]["is_bot"] = True
    assert convert(other) == Skip("from-bot")


def test_non_messages_skipped(tg: FakeTelegramServer) -> None:
    """Edits, channel posts and service messages are not messages for the agent."""
    raw = tg.user_message(42, "typo")
    edited = {"update_id": raw["update_id"], "edited_message": raw["message"]}
    assert convert(edited) == Skip("not-a-message")
    service = tg.user_message(GROUP, "x", chat_type="supergroup")
    del service["message"]["text"]
    service["message"]["new_chat_members"] = [{"id": 5, "is_bot": False, "first_name": "N"}]
    assert convert(service, group_mode="all") == Skip("not-a-message")


def test_other_media_refused_with_notice_only_in_private(tg: FakeTelegramServer) -> None:
    """A location (no file to read) gets a short notice in a DM and silence in a group."""
    location = {"latitude": 48.85, "longitude": 2.35}
    private = tg.user_message(42, "x")
    del private["message"]["text"]
    private["message"]["location"] = location
    assert convert(private) == Skip("unsupported", UNSUPPORTED_NOTICE)
    group = tg.user_message(GROUP, "x", chat_type="supergroup", reply_to_bot=True)
    del group["message"]["text"]
    group["message"]["location"] = location
    assert convert(group) == Skip("unsupported")


def test_photo_with_caption_and_file_only_messages(tg: FakeTelegramServer) -> None:
    """The caption is the text; a file without one is a message with empty text."""
    photo = convert(tg.user_media(42, "photo", b"jpeg bytes", caption="what is this?"))
    assert isinstance(photo, Inbound)
    assert (photo.text, photo.attachments) == ("what is this?", ())  # files: fetched later
    voice = convert(tg.user_media(42, "voice", b"OggS", mime_type="audio/ogg"))
    assert isinstance(voice, Inbound)
    assert voice.text == ""


def test_caption_mention_addresses_the_bot_in_groups(tg: FakeTelegramServer) -> None:
    """In mention mode a group photo counts when its caption mentions the bot."""
    assert isinstance(convert(tg.user_media(GROUP, "photo", b"x", chat_type="supergroup",
                                            caption="@fake_test_bot look")), Inbound)
    assert convert(tg.user_media(GROUP, "photo", b"x", chat_type="supergroup",
                                 caption="look")) == Skip("not-addressed")


def message_of(raw: dict[str, Any]) -> Message:
    update = Update.de_json(raw, None)
    assert update.message is not None
    return update.message


def test_files_of_picks_what_to_fetch(tg: FakeTelegramServer) -> None:
    """The largest photo size within the limit; documents, voice, audio, video notes and
    static stickers by id with their claims; what is over the limit or a video, not at all."""
    photo = files_of(message_of(tg.user_media(42, "photo", b"p" * 1600)), max_bytes=1000)
    assert [(f.name, f.media_type, f.kind, f.size) for f in photo
            if isinstance(f, TelegramFile)] == [("photo.jpg", "image/jpeg", "photo", 400)]
    assert files_of(message_of(tg.user_media(42, "photo", b"p" * 1600)), max_bytes=10) == [
        Attachment("photo.jpg", "image/jpeg", kind="photo", size=1600, problem="too-large")]
    cases = {
        "document": ("report.pdf", "application/pdf", "document"),
        "voice": ("voice.ogg", "audio/ogg", "voice"),
        "audio": ("song.mp3", "audio/mpeg", "audio"),
        "video_note": ("video-note.mp4", "video/mp4", "video_note"),
        "sticker": ("sticker.webp", "image/webp", "sticker"),
    }
    for kind, (name, mime, expected_kind) in cases.items():
        [found] = files_of(message_of(tg.user_media(42, kind, b"data", file_name=name,
                                                    mime_type=mime)), max_bytes=1000)
        assert isinstance(found, TelegramFile), kind
        assert (found.name, found.media_type, found.kind, found.size) == (
            name, mime, expected_kind, 4)
    [big] = files_of(message_of(tg.user_media(42, "document", b"x", file_name="big.iso",
                                              declared_size=5000)), max_bytes=1000)
    assert big == Attachment("big.iso", "application/octet-stream", kind="document", size=5000,
                             problem="too-large")
    [gif] = files_of(message_of(tg.user_media(42, "animation", b"GIF89a", file_name="a.gif",
                                              mime_type="video/mp4")), max_bytes=1000)
    assert (gif.problem, gif.kind) == ("unsupported", "video")  # type: ignore[union-attr]


def test_animated_sticker_is_text(tg: FakeTelegramServer) -> None:
    """An animated sticker is not fetched; it reads as its emoji."""
    raw = tg.user_media(42, "sticker", b"tgs", is_animated=True, emoji="🎉")
    inbound = convert(raw)
    assert isinstance(inbound, Inbound)
    assert inbound.text == "[sticker 🎉]"
    assert files_of(message_of(raw), max_bytes=1000) == []


@pytest.mark.parametrize(("api", "files", "expected"), [
    (None, None, "https://api.telegram.org/file/bot"),
    ("http://127.0.0.1:8081/bot", None, "http://127.0.0.1:8081/file/bot"),
    ("http://h/custom/bot", None, "http://h/custom/file/bot"),
    ("http://h/api", None, "https://api.telegram.org/file/bot"),
    ("http://h/bot", "http://files.example/x/bot", "http://files.example/x/bot"),
])
def test_file_base_url(api: str | None, files: str | None, expected: str) -> None:
    """TELEGRAM_FILE_BASE_URL wins; else derived from a base URL ending in /bot; else PTB's."""
    assert file_base_url(api, files) == expected


def test_too_long_refused_with_notice_only_in_private(tg: FakeTelegramServer) -> None:
    """Over max_chars: a notice in a DM, silence in a group; exactly max_chars passes."""
    assert isinstance(convert(tg.user_message(42, "x" * 100)), Inbound)
    assert convert(tg.user_message(42, "x" * 101)) == Skip(
        "too-long", TOO_LONG_NOTICE.format(length=101, limit=100))
    group = tg.user_message(GROUP, "@fake_test_bot " + "x" * 100, chat_type="supergroup")
    assert convert(group) == Skip("too-long")


def test_blank_text_skipped(tg: FakeTelegramServer) -> None:
    """Whitespace-only text is not a message."""
    assert convert(tg.user_message(42, " \n ")) == Skip("empty")
