"""Telegram updates -> :class:`gateway.messages.Inbound` (pure: no I/O, no clock, no state).

What becomes an inbound message, and what does not (the :class:`Skip` reason says why):

* only ``message`` updates with text; edits, channel posts, callbacks and the rest are
  ``not-a-message``; messages from the bot itself (``own-message``) and from other bots,
  including the anonymous-admin and linked-channel senders (``from-bot``), are skipped so
  bots can never talk to each other in a loop;
* private chats always count; in groups and supergroups, with ``group_mode="mention"``, only a
  message that mentions the bot (an ``@username`` mention, a ``text_mention`` of the bot, or a
  ``/command@username``) or replies to one of the bot's messages counts (``not-addressed``);
  with ``group_mode="all"`` every text message counts;
* media without text (``unsupported``) and texts longer than ``max_chars`` (``too-long``) are
  refused; in a private chat the refusal carries a short :attr:`Skip.notice` for the sender.
  In groups refusals stay silent: the access gate has not vetted the group at that point, and
  a bot must not answer in groups nobody allowed;
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

from gateway.messages import ConversationKey, Inbound, Sender

CHANNEL: Final = "telegram"
GroupMode = Literal["mention", "all"]

UNSUPPORTED_NOTICE: Final = "Sorry, I can only read text messages for now."
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
    text = message.text
    if text is None:
        if message.effective_attachment is None:
            return Skip("not-a-message")  # a service message: member joined, pinned, ...
        return Skip("unsupported", UNSUPPORTED_NOTICE if private else None)
    text = _UNPRINTABLE.sub("", text)
    if not text.strip():
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
    """Whether a group message mentions the bot or replies to one of its messages."""
    for entity, text in message.parse_entities(_ADDRESSING).items():
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
