"""Telegram updates -> :class:`gateway.edge.messages.Inbound` (pure: no I/O, no clock, no state).

What becomes an inbound message, and what does not (the :class:`Skip` reason says why):

* only ``message`` updates with text; edits, channel posts, callbacks and the rest are
  ``not-a-message``; messages from the bot itself (``own-message``) and from other bots,
  including the anonymous-admin and linked-channel senders (``from-bot``), are skipped so
  bots can never talk to each other in a loop;
* private chats always count; in groups and supergroups, with ``group_mode="mention"``, only a
  message that mentions the bot (an ``@username`` mention, a ``text_mention`` of the bot, or a
  ``/command@username``) or replies to one of the bot's messages counts (``not-addressed``);
  with ``group_mode="all"`` every text message counts;
* photos, documents, voice notes, audio, video notes, stickers (and videos, which the core
  refuses with a notice) count, with their caption as the text (possibly empty);
  :func:`files_of` says which file of each to fetch (the largest photo size within the limit)
  and which it cannot (over the limit: Telegram serves bots at most 20 MB); an animated or
  video sticker becomes the text ``[sticker 😀]``;
* other media (locations, polls, contacts...: ``unsupported``) and texts longer than
  ``max_chars`` (``too-long``) are refused; in a private chat the refusal carries a short
  :attr:`Skip.notice` for the sender. In groups refusals stay silent: the access gate has not
  vetted the group at that point, and a bot must not answer in groups nobody allowed;
* a message in a forum topic is its own conversation:
  ``ConversationKey("telegram", chat_id, thread=message_thread_id)``. The text is kept verbatim,
  mention included: the session records what the person wrote, less control characters and
  lone surrogates (as on the other channels: no UTF-8 session log can hold the latter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from telegram import Message, MessageEntity, Update

from gateway.edge.messages import Attachment, ConversationKey, Inbound, Sender

CHANNEL: Final = "telegram"
GroupMode = Literal["mention", "all"]

UNSUPPORTED_NOTICE: Final = (
    "Sorry, I can't read that kind of message. Text, photos, documents and voice notes work.")
TOO_LONG_NOTICE: Final = (
    "Sorry, that message is too long ({length} characters; the limit is {limit}). "
    "Please send a shorter one."
)
GROUP_TYPES: Final = frozenset({"group", "supergroup"})
# Cc characters except \t and \n, and lone surrogates.
_UNPRINTABLE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_ADDRESSING: Final[list[str | None]] = [
    MessageEntity.MENTION, MessageEntity.TEXT_MENTION, MessageEntity.BOT_COMMAND,
]


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who the bot is (from ``getMe``): needed to tell mentions and own messages."""

    id: int
    username: str

    @property
    def mention(self) -> str:
        return f"@{self.username}".lower()


@dataclass(frozen=True, slots=True)
class Skip:
    """An update that is not a message for the agent. ``reason`` is short and safe to log."""

    reason: str
    notice: str | None = None
    """A short reply for the sender (private chats only), or None to stay silent."""


def to_inbound(
    update: Update,
    *,
    bot: BotIdentity,
    group_mode: GroupMode = "mention",
    max_chars: int,
    received_at: float = 0.0,
) -> Inbound | Skip:
    """Translate one update; see the module docstring for the rules."""
    message = update.message
    if message is None:
        return Skip("not-a-message")
    chat, user = message.chat, message.from_user
    if chat.type not in GROUP_TYPES and chat.type != "private":
        return Skip("not-a-message")
    if user is None:
        return Skip("from-bot")  # sender_chat only: a channel or an anonymous admin
    if user.id == bot.id:
        return Skip("own-message")
    if user.is_bot:
        return Skip("from-bot")
    private = chat.type == "private"
    if not private and group_mode == "mention" and not addressed(message, bot):
        return Skip("not-addressed")
    text = message.text if message.text is not None else message.caption
    files = has_files(message)
    if text is None and not files:
        if message.effective_attachment is None:
            return Skip("not-a-message")  # a service message: member joined, pinned, ...
        return Skip("unsupported", UNSUPPORTED_NOTICE if private else None)
    text = _UNPRINTABLE.sub("", text or "")
    sticker = message.sticker
    if not text.strip() and sticker is not None and (sticker.is_animated or sticker.is_video):
        text = f"[sticker {sticker.emoji or ''}]".replace(" ]", "]")
    if not text.strip() and not files:
        return Skip("empty")
    if len(text) > max_chars:
        notice = TOO_LONG_NOTICE.format(length=len(text), limit=max_chars)
        return Skip("too-long", notice if private else None)
    topic = message.message_thread_id if message.is_topic_message else None
    meta: dict[str, Any] = {"chat_id": chat.id, "message_id": message.message_id}
    if topic is not None:
        meta["thread_id"] = topic
    if user.username:
        meta["username"] = user.username
    return Inbound(
        key=ConversationKey(CHANNEL, str(chat.id), thread=None if topic is None else str(topic)),
        sender=Sender(str(user.id), user.full_name or user.username or None),
        text=text,
        platform_id=str(update.update_id),
        chat_type=chat.type,
        received_at=received_at,
        meta=meta,
    )


def addressed(message: Message, bot: BotIdentity) -> bool:
    """Whether a group message (or a caption) mentions the bot or replies to one of its
    messages."""
    entities = {**message.parse_entities(_ADDRESSING),
                **message.parse_caption_entities(_ADDRESSING)}
    for entity, text in entities.items():
        if entity.type == MessageEntity.MENTION and text.lower() == bot.mention:
            return True
        if entity.type == MessageEntity.TEXT_MENTION and entity.user and entity.user.id == bot.id:
            return True
        if entity.type == MessageEntity.BOT_COMMAND and text.lower().endswith(bot.mention):
            return True
    replied = message.reply_to_message
    # In a forum topic every message "replies" to the topic's creation message; that is not
    # a reply to the bot even when the bot opened the topic.
    return (
        replied is not None
        and replied.forum_topic_created is None
        and replied.from_user is not None
        and replied.from_user.id == bot.id
    )


# -- files -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TelegramFile:
    """A file to fetch with ``getFile``, and what the core is told about it."""

    file_id: str
    name: str
    media_type: str
    kind: str
    size: int | None


def has_files(message: Message) -> bool:
    """Whether the message carries a file :func:`files_of` knows about."""
    return any(getattr(message, kind) for kind in _FILE_KINDS)


_FILE_KINDS: Final = ("photo", "document", "voice", "audio", "video_note", "sticker", "video",
                      "animation")


def files_of(message: Message, max_bytes: int) -> list[TelegramFile | Attachment]:
    """The files to fetch (:class:`TelegramFile`) and, as :class:`Attachment` with a
    ``problem``, those not to fetch: over ``max_bytes`` (Telegram's declared size) or a kind
    the core refuses (videos, GIF animations). Animated stickers are text (see
    :func:`to_inbound`), not files."""
    found: list[TelegramFile | Attachment] = []
    if message.photo:
        fitting = [p for p in message.photo if p.file_size is None or p.file_size <= max_bytes]
        if fitting:  # the largest size that fits: Telegram lists them smallest first
            best = max(fitting, key=lambda p: (p.width * p.height, p.file_size or 0))
            found.append(TelegramFile(best.file_id, "photo.jpg", "image/jpeg", "photo",
                                      best.file_size))
        else:
            largest = max(message.photo, key=lambda p: p.file_size or 0)
            found.append(Attachment("photo.jpg", "image/jpeg", kind="photo",
                                    size=largest.file_size, problem="too-large"))
    # A GIF comes as both animation and document: it is refused once, as an animation.
    document = message.document if message.animation is None else None
    if document is not None:
        found.append(_file(document.file_id, document.file_name or "document",
                           document.mime_type, "document", document.file_size, max_bytes))
    voice = message.voice
    if voice is not None:
        found.append(_file(voice.file_id, "voice.ogg", voice.mime_type or "audio/ogg", "voice",
                           voice.file_size, max_bytes))
    audio = message.audio
    if audio is not None:
        found.append(_file(audio.file_id, audio.file_name or "audio", audio.mime_type, "audio",
                           audio.file_size, max_bytes))
    note = message.video_note
    if note is not None:
        found.append(_file(note.file_id, "video-note.mp4", "video/mp4", "video_note",
                           note.file_size, max_bytes))
    sticker = message.sticker
    if sticker is not None and not (sticker.is_animated or sticker.is_video):
        found.append(_file(sticker.file_id, "sticker.webp", "image/webp", "sticker",
                           sticker.file_size, max_bytes))
    moving = message.animation or message.video
    if moving is not None:
        found.append(Attachment(moving.file_name or "video.mp4", moving.mime_type or "video/mp4",
                                kind="video", size=moving.file_size, problem="unsupported"))
    return found


def _file(file_id: str, name: str, media_type: str | None, kind: str, size: int | None,
          max_bytes: int) -> TelegramFile | Attachment:
    claimed = media_type or "application/octet-stream"
    if size is not None and size > max_bytes:
        return Attachment(name, claimed, kind=kind, size=size, problem="too-large")
    return TelegramFile(file_id, name, claimed, kind, size)
