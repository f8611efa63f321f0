"""A local fake of the Telegram Bot API, speaking the real HTTP protocol.

Point the real python-telegram-bot (PTB) at it::

    async with FakeTelegramServer() as tg:
        async with telegram.Bot(tg.token, base_url=tg.base_url,
                                base_file_url=tg.base_file_url) as bot:
            tg.user_message(42, "hi")
            updates = await bot.get_updates(timeout=1)

Only 127.0.0.1 is used. The fake keeps the parts of the real server's behaviour that
adapters depend on: long polling with offset acknowledgement, 409 conflicts, flood
errors with ``retry_after``, HTML entity parsing with Telegram's exact error texts and
UTF-16 length accounting, per-chat message ids, webhooks with the secret-token header,
files: ``getFile`` (400 "file is too big" past 20 MB, as the real server answers bots),
downloads under ``/file/bot<token>/<path>`` with the token checked (held while
``file_hold`` is closed, for tests of what happens meanwhile), media messages
(:meth:`FakeTelegramServer.user_media`) and ``sendDocument`` uploads. A file can also be one
that a misbehaving (or self-hosted) server serves without a true size
(:meth:`FakeTelegramServer.add_unsized_file`): generated as it streams, never held whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self

import aiohttp
import orjson
from aiohttp import web

from tests.fakes.hold import Dropped, OutboundHold

JSONDict = dict[str, Any]
MethodHandler = Callable[[JSONDict], Awaitable[Any]]

MAX_MESSAGE_UTF16 = 4096
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024
"""The Bot API serves bots files up to 20 MB; getFile refuses bigger ones."""
_DEFAULT_TOKEN = "123456789:AAFakeTokenForLocalTestsOnly_0123456789"

# Parameters PTB (and the Bot API) transmit as JSON-serialised strings inside form data.
_JSON_FIELDS = frozenset(
    {
        "entities",
        "caption_entities",
        "reply_parameters",
        "reply_markup",
        "link_preview_options",
        "allowed_updates",
        "commands",
        "scope",
        "media",
        "results",
        "options",
        "explanation_entities",
        "reaction",
        "permissions",
    }
)
_INT_FIELDS = frozenset(
    {
        "chat_id",
        "from_chat_id",
        "message_id",
        "offset",
        "limit",
        "timeout",
        "message_thread_id",
        "reply_to_message_id",
        "user_id",
        "max_connections",
        "until_date",
        "direct_messages_topic_id",
    }
)
_BOOL_FIELDS = frozenset(
    {
        "disable_notification",
        "protect_content",
        "allow_sending_without_reply",
        "drop_pending_updates",
        "disable_web_page_preview",
        "allow_paid_broadcast",
        "is_big",
        "only_if_banned",
    }
)
# Update types the real server withholds unless explicitly requested in allowed_updates.
_OPT_IN_UPDATE_TYPES = frozenset({"chat_member", "message_reaction", "message_reaction_count"})
_CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
_DEFAULT_DESCRIPTIONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden: bot was blocked by the user",
    404: "Not Found",
    409: "Conflict: terminated by other getUpdates request; "
    "make sure that only one bot instance is running",
    500: "Internal Server Error",
    502: "Bad Gateway",
}
_WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first"
)
_POLL_CONFLICT = _DEFAULT_DESCRIPTIONS[409]
_NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a current content and reply markup of the message"
)


class TelegramApiError(Exception):
    """An error answer of the Bot API; the HTTP status equals ``error_code`` like the real one."""

    def __init__(self, error_code: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.error_code = error_code
        self.description = description
        self.retry_after = retry_after

    def payload(self) -> JSONDict:
        body: JSONDict = {
            "ok": False,
            "error_code": self.error_code,
            "description": self.description,
        }
        if self.retry_after is not None:
            body["parameters"] = {"retry_after": self.retry_after}
        return body


class HtmlParseError(ValueError):
    """Malformed Telegram HTML; the message is tdlib's text (after "can't parse entities: ")."""


@dataclass
class SentCall:
    """One Bot API request the client made (everything except getUpdates)."""

    method: str
    params: JSONDict
    chat_id: int | str | None
    text: str | None
    time: float
    result: Any = None
    error_code: int | None = None
    description: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_code is None


@dataclass
class UploadedFile:
    """A multipart file part, kept in memory."""

    filename: str | None
    content_type: str
    data: bytes


@dataclass
class WebhookConfig:
    url: str
    secret_token: str | None = None
    max_connections: int = 40
    allowed_updates: list[str] | None = None
    ip_address: str | None = None
    last_error_date: int | None = None
    last_error_message: str | None = None


@dataclass
class WebhookDelivery:
    """One automatic webhook POST attempt made by the fake (like Telegram's pushes)."""

    update_id: int
    url: str
    status: int | None
    error: str | None
    time: float


@dataclass
class _Fault:
    error_code: int
    description: str
    retry_after: int | None
    remaining: int


@dataclass
class _Delay:
    seconds: float
    remaining: int


class _Pulse:
    """Broadcast "something changed" to any number of waiters, usable from sync code."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seconds: float | None) -> None:
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)


def utf16_len(text: str) -> int:
    """Length as Telegram counts it (UTF-16 code units; astral chars count twice)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


# --------------------------------------------------------------------------------------
# HTML parse_mode: a port of tdlib's parse_html, so error texts match the real server.
# --------------------------------------------------------------------------------------

_HTML_TAGS = frozenset(
    {
        "a",
        "b",
        "strong",
        "i",
        "em",
        "s",
        "strike",
        "del",
        "u",
        "ins",
        "tg-spoiler",
        "tg-emoji",
        "span",
        "pre",
        "code",
        "blockquote",
    }
)
_SIMPLE_ENTITY_TYPES = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "u": "underline",
    "ins": "underline",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
}
_HTML_SPACE = " \t\r\n\v\0"
_NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}


@dataclass
class _OpenTag:
    name: str
    argument: str
    utf16_offset: int


def _byte_offset(text: str, index: int) -> int:
    # tdlib reports positions in UTF-8 bytes of the original text.
    return len(text[:index].encode("utf-8", "surrogatepass"))


def _char_at(text: str, index: int) -> str:
    # tdlib walks a NUL-terminated buffer; "\0" plays the end-of-text role here.
    return text[index] if index < len(text) else "\0"


def _decode_html_entity(text: str, pos: int) -> tuple[str, int] | None:
    """Decode ``&...;`` at ``pos``; returns (char, next index) or None if not an entity.

    Like tdlib, the trailing ';' is optional and unknown names leave the '&' literal.
    """
    end = pos + 1
    if _char_at(text, end) == "#":
        end += 1
        value = 0
        hexadecimal = _char_at(text, end) == "x"
        if hexadecimal:
            end += 1
        digits = "0123456789abcdefABCDEF" if hexadecimal else "0123456789"
        while _char_at(text, end) in digits:  # "\0" (end of text) is never a digit
            value = value * (16 if hexadecimal else 10) + int(text[end], 16)
            end += 1
            if value >= 0x10FFFF:
                return None
        if value == 0 or 0xD800 <= value <= 0xDFFF:
            return None
        char = chr(value)
    else:
        while _char_at(text, end).isascii() and _char_at(text, end).isalpha():
            end += 1
        name = text[pos + 1 : end]
        if name not in _NAMED_ENTITIES:
            return None
        char = _NAMED_ENTITIES[name]
    if _char_at(text, end) == ";":
        end += 1
    return char, end


def _close_entity(tag: _OpenTag, end_utf16: int, entities: list[JSONDict]) -> None:
    length = end_utf16 - tag.utf16_offset
    if length <= 0:
        return  # tdlib silently drops empty entities
    entity: JSONDict = {"offset": tag.utf16_offset, "length": length}
    if tag.name in _SIMPLE_ENTITY_TYPES:
        entity["type"] = _SIMPLE_ENTITY_TYPES[tag.name]
    elif tag.name == "a":
        if not tag.argument:
            return
        entity.update(type="text_link", url=tag.argument)
    elif tag.name == "code":
        entity["type"] = "code"
        if tag.argument:
            entity["_language"] = tag.argument  # consumed by an enclosing <pre>
    elif tag.name == "pre":
        last = entities[-1] if entities else None
        if (
            last is not None
            and last.get("type") == "code"
            and last["offset"] == tag.utf16_offset
            and last["length"] == length
            and "_language" in last
        ):
            # <pre><code class="language-x">...</code></pre> is one pre entity with a language.
            entities.pop()
            entity.update(type="pre", language=last["_language"])
        else:
            entity["type"] = "pre"
    elif tag.name == "blockquote":
        entity["type"] = "expandable_blockquote" if tag.argument else "blockquote"
    elif tag.name == "tg-emoji":
        if not tag.argument.isdigit():
            raise HtmlParseError("Invalid custom emoji identifier specified")
        entity.update(type="custom_emoji", custom_emoji_id=tag.argument)
    entities.append(entity)


def _parse_start_tag(text: str, begin: int) -> tuple[_OpenTag, int]:
    """Parse ``<name attr=...>`` starting at ``begin``; returns the tag and index of '>'."""
    i = begin + 1
    name_start = i
    while _char_at(text, i) not in _HTML_SPACE and _char_at(text, i) != ">":
        i += 1
    if i >= len(text):
        raise HtmlParseError(f"Unclosed start tag at byte offset {_byte_offset(text, begin)}")
    tag_name = text[name_start:i].lower()
    if tag_name not in _HTML_TAGS:
        raise HtmlParseError(
            f'Unsupported start tag "{tag_name}" at byte offset {_byte_offset(text, begin)}'
        )
    argument = ""
    while _char_at(text, i) != ">":
        while i < len(text) and _char_at(text, i) in _HTML_SPACE:
            i += 1
        if _char_at(text, i) == ">":
            break
        if i >= len(text):
            raise HtmlParseError(f"Unclosed start tag at byte offset {_byte_offset(text, begin)}")
        attr_start = i
        while _char_at(text, i) not in _HTML_SPACE and _char_at(text, i) not in "=>":
            i += 1
        attr_name = text[attr_start:i].lower()
        while i < len(text) and _char_at(text, i) in _HTML_SPACE:
            i += 1
        if _char_at(text, i) != "=":
            if tag_name == "blockquote" and attr_name == "expandable":
                argument = "1"
                continue
            if i >= len(text):
                raise HtmlParseError(
                    f"Unclosed start tag at byte offset {_byte_offset(text, begin)}"
                )
            raise HtmlParseError(
                "Expected equal sign in declaration of an attribute of the tag "
                f'"{tag_name}" at byte offset {_byte_offset(text, begin)}'
            )
        i += 1
        while i < len(text) and _char_at(text, i) in _HTML_SPACE:
            i += 1
        if i >= len(text):
            raise HtmlParseError(f"Unclosed start tag at byte offset {_byte_offset(text, begin)}")
        value, i = _parse_attribute_value(text, i, begin)
        if tag_name == "a" and attr_name == "href":
            argument = value
        elif tag_name == "code" and attr_name == "class" and value.startswith("language-"):
            argument = value.removeprefix("language-")
        elif tag_name == "span" and attr_name == "class" and value.startswith("tg-"):
            argument = value.removeprefix("tg-")
        elif tag_name == "tg-emoji" and attr_name == "emoji-id":
            argument = value
    if tag_name == "span" and argument != "spoiler":
        raise HtmlParseError(
            f'Tag "span" must have class "tg-spoiler" at byte offset {_byte_offset(text, begin)}'
        )
    return _OpenTag(tag_name, argument, 0), i


def _parse_attribute_value(text: str, i: int, tag_begin: int) -> tuple[str, int]:
    quote = text[i]
    if quote not in "'\"":
        # An unquoted HTML name token: letters, digits, '.', '-'; case-insensitive.
        token_start = i
        while _char_at(text, i) != "\0" and (text[i].isalnum() or text[i] in ".-"):
            i += 1
        if _char_at(text, i) not in _HTML_SPACE and _char_at(text, i) != ">":
            raise HtmlParseError(
                f"Unexpected end of name token at byte offset {_byte_offset(text, token_start)}"
            )
        return text[token_start:i].lower(), i
    i += 1
    chars: list[str] = []
    while i < len(text) and text[i] != quote:
        if text[i] == "&":
            decoded = _decode_html_entity(text, i)
            if decoded is not None:
                chars.append(decoded[0])
                i = decoded[1]
                continue
        chars.append(text[i])
        i += 1
    if _char_at(text, i) == quote:
        i += 1
    if i >= len(text):
        raise HtmlParseError(f"Unclosed start tag at byte offset {_byte_offset(text, tag_begin)}")
    return "".join(chars), i


def parse_telegram_html(text: str) -> tuple[str, list[JSONDict]]:
    """Return (visible text, entities) the way the Bot API parses parse_mode=HTML.

    Raises HtmlParseError with tdlib's message on malformed markup.
    """
    out: list[str] = []
    out_utf16 = 0
    stack: list[_OpenTag] = []
    entities: list[JSONDict] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "&":
            decoded = _decode_html_entity(text, i)
            if decoded is not None:
                out.append(decoded[0])
                out_utf16 += utf16_len(decoded[0])
                i = decoded[1]
                continue
        if char != "<":
            out.append(char)
            out_utf16 += utf16_len(char)
            i += 1
            continue
        begin = i
        if _char_at(text, i + 1) != "/":
            tag, i = _parse_start_tag(text, begin)
            tag.utf16_offset = out_utf16
            stack.append(tag)
            i += 1
            continue
        if not stack:
            raise HtmlParseError(f"Unexpected end tag at byte offset {_byte_offset(text, begin)}")
        i = begin + 2
        while _char_at(text, i) not in _HTML_SPACE and _char_at(text, i) != ">":
            i += 1
        end_name = text[begin + 2 : i].lower()
        while i < len(text) and _char_at(text, i) in _HTML_SPACE:
            i += 1
        if _char_at(text, i) != ">":
            raise HtmlParseError(f"Unclosed end tag at byte offset {_byte_offset(text, begin)}")
        open_tag = stack[-1]
        if end_name and end_name != open_tag.name:
            raise HtmlParseError(
                f"Unmatched end tag at byte offset {_byte_offset(text, begin)}, "
                f'expected "</{open_tag.name}>", found "</{end_name}>"'
            )
        _close_entity(open_tag, out_utf16, entities)
        stack.pop()
        i += 1
    if stack:
        raise HtmlParseError(f'Can\'t find end tag corresponding to start tag "{stack[-1].name}"')
    for entity in entities:
        entity.pop("_language", None)
    entities.sort(key=lambda e: (e["offset"], -e["length"]))
    # Key order like the real API: type, offset, length, extras.
    ordered = [
        {"type": e["type"], "offset": e["offset"], "length": e["length"]}
        | {k: v for k, v in e.items() if k not in ("type", "offset", "length")}
        for e in entities
    ]
    return "".join(out), ordered


# --------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------

_COMMAND_RE = re.compile(r"(?<!\S)/[A-Za-z0-9_]{1,32}(?:@[A-Za-z0-9_]{5,32})?(?![\w@])")
_MENTION_RE = re.compile(r"(?<![\w@/])@[A-Za-z0-9_]{5,32}\b")
_BOT_COMMAND_RE = re.compile(r"[a-z0-9_]{1,32}")


class FakeTelegramServer:
    """In-process Bot API server on 127.0.0.1 with recording and fault injection.

    Behaviour notes (match the real API unless said otherwise):
      * every method answers ``{"ok": true, "result": ...}`` or an error object whose
        ``error_code`` is also the HTTP status (PTB maps the status to exception classes);
      * wrong token -> 401 Unauthorized, unknown method -> 404 Not Found;
      * a second concurrent getUpdates makes the older one fail with 409;
      * sending to a chat the fake has never seen -> 400 "chat not found"
        (``strict_chats=False`` synthesises chats instead);
      * while a webhook is set, pushed updates are POSTed to it automatically
        (``auto_deliver_webhook``), removed on a 2xx answer, retried otherwise;
      * Markdown/MarkdownV2 are accepted but not validated (text is stored verbatim).
    """

    def __init__(
        self,
        token: str = _DEFAULT_TOKEN,
        *,
        bot_username: str = "fake_test_bot",
        bot_first_name: str = "Fake Bot",
        strict_chats: bool = True,
        auto_deliver_webhook: bool = True,
        webhook_retry_delay: float = 0.2,
        first_update_id: int = 100_000,
    ) -> None:
        self.token = token
        self.bot_user: JSONDict = {
            "id": int(token.split(":", 1)[0]),
            "is_bot": True,
            "first_name": bot_first_name,
            "username": bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }
        self.strict_chats = strict_chats
        self.auto_deliver_webhook = auto_deliver_webhook
        self.webhook_retry_delay = webhook_retry_delay

        # Recording
        self.sent: list[SentCall] = []
        self.get_updates_calls = 0
        self.get_updates_active = 0
        self.last_get_updates_params: JSONDict | None = None
        self.confirmed_offset = 0
        self.last_headers: dict[str, str] = {}  # of the last deliver_webhook answer
        self.webhook_deliveries: list[WebhookDelivery] = []

        # State
        self.pending_updates: list[JSONDict] = []
        self.allowed_updates: list[str] | None = None
        self.webhook: WebhookConfig | None = None
        self.chats: dict[int, JSONDict] = {}
        self.messages: dict[tuple[int, int], JSONDict] = {}
        self.commands: dict[tuple[str, str], list[JSONDict]] = {}
        self.files: dict[str, bytes] = {}  # served at base_file_url + token + "/" + path
        self.file_ids: dict[str, tuple[str, int]] = {}  # file_id -> (path, size)
        self.downloads: list[str] = []  # paths downloaded, in order
        self.file_lookups: list[str] = []  # file ids asked of getFile, in order
        self.generated: dict[str, int] = {}  # path -> size of a file streamed as zero bytes
        self.streamed: dict[str, int] = {}  # path -> bytes of it sent before the client left
        self._sizeless: set[str] = set()  # file ids whose getFile answer has no file_size
        self.documents: list[tuple[int, UploadedFile]] = []  # (chat, file) sent with sendDocument
        self._next_file = 0
        self._next_update_id = first_update_id
        self._next_message_id: dict[int, int] = {}
        self._poll_generation = 0
        self._faults: dict[str, list[_Fault]] = {}
        self._delays: dict[str, list[_Delay]] = {}
        self.outbound = OutboundHold(frozenset({
            "sendmessage", "editmessagetext", "senddocument", "sendphoto", "sendaudio",
            "sendvoice", "sendvideo", "deletemessage"}))
        """Hold replies (see :mod:`tests.fakes.hold`)."""
        self.file_hold = OutboundHold(frozenset({"file"}))
        """Hold file downloads (``/file/bot<token>/``): a held one waits before its bytes are
        sent (and recorded in ``downloads``); one dropped is answered 502."""
        self._extra_methods: dict[str, MethodHandler] = {}
        self._updates_pulse = _Pulse()
        self._sent_pulse = _Pulse()
        self._closing = False

        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._webhook_task: asyncio.Task[None] | None = None
        self._port: int | None = None
        self._methods: dict[str, tuple[str, MethodHandler]] = {
            name.lower(): (name, handler)
            for name, handler in {
                "getMe": self._get_me,
                "getUpdates": self._get_updates,
                "setWebhook": self._set_webhook,
                "deleteWebhook": self._delete_webhook,
                "getWebhookInfo": self._get_webhook_info,
                "sendMessage": self._send_message,
                "editMessageText": self._edit_message_text,
                "deleteMessage": self._delete_message,
                "sendChatAction": self._send_chat_action,
                "setMyCommands": self._set_my_commands,
                "getMyCommands": self._get_my_commands,
                "deleteMyCommands": self._delete_my_commands,
                "getChat": self._get_chat,
                "getFile": self._get_file,
                "sendDocument": self._send_document,
            }.items()
        }

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle_api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._handle_file)
        # A short shutdown timeout: hanging long polls must not stall test teardown.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]
        self._session = aiohttp.ClientSession()
        self._webhook_task = asyncio.create_task(self._webhook_worker())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing = True
        self._updates_pulse.fire()  # release waiting long polls
        if self._webhook_task is not None:
            self._webhook_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._webhook_task
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeTelegramServer is not started (use 'async with')")
        return self._port

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """For ``Bot(token, base_url=...)``: PTB requests ``{base_url}{token}/{method}``."""
        return f"{self.root_url}/bot"

    @property
    def base_file_url(self) -> str:
        return f"{self.root_url}/file/bot"

    # ----------------------------------------------------------------- test helpers

    def add_chat(
        self,
        chat_id: int,
        chat_type: str = "private",
        *,
        title: str | None = None,
        username: str | None = None,
        first_name: str | None = None,
        is_forum: bool = False,
    ) -> JSONDict:
        """Register (or return) a chat so the bot may send to it."""
        if chat_id in self.chats:
            return self.chats[chat_id]
        chat: JSONDict = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            chat["first_name"] = first_name or "Test"
            chat["username"] = username or f"user{chat_id}"
        else:
            chat["title"] = title or f"Test {chat_type} {abs(chat_id)}"
            if username:
                chat["username"] = username
            if chat_type == "supergroup" and is_forum:
                chat["is_forum"] = True
        self.chats[chat_id] = chat
        return chat

    def push_update(self, update: JSONDict) -> JSONDict:
        """Queue a raw Update (``update_id`` assigned when missing) and wake pollers."""
        if "update_id" not in update:
            update = {"update_id": self._next_update_id, **update}
        self._next_update_id = max(self._next_update_id, update["update_id"] + 1)
        self.pending_updates.append(update)
        self._updates_pulse.fire()
        return update

    def user_message(
        self,
        chat_id: int,
        text: str,
        *,
        user_id: int | None = None,
        chat_type: str = "private",
        message_thread_id: int | None = None,
        reply_to_bot: bool = False,
        reply_to_message_id: int | None = None,
        entities: list[JSONDict] | None = None,
        username: str | None = None,
        first_name: str = "Test",
        language_code: str = "en",
    ) -> JSONDict:
        """Build, store and push a ``message`` Update from a human; returns the Update.

        Without ``entities``, bot_command and mention entities are detected the way
        Telegram clients/servers do. ``reply_to_bot`` replies to the bot's latest
        message in that chat (a placeholder bot message is created if there is none).
        """
        if user_id is None:
            user_id = chat_id if chat_type == "private" else 424242
        username = username or f"user{user_id}"
        chat = self.add_chat(
            chat_id,
            chat_type,
            username=username if chat_type == "private" else None,
            first_name=first_name if chat_type == "private" else None,
            is_forum=message_thread_id is not None and chat_type == "supergroup",
        )
        sender = {
            "id": user_id,
            "is_bot": False,
            "first_name": first_name,
            "username": username,
            "language_code": language_code,
        }
        reply_to: JSONDict | None = None
        if reply_to_message_id is not None:
            reply_to = self.messages.get((chat_id, reply_to_message_id))
        elif reply_to_bot:
            reply_to = self._latest_bot_message(chat_id, message_thread_id)
            if reply_to is None:
                reply_to = self._store_message(
                    chat, self.bot_user, "(earlier bot message)", None, message_thread_id, None
                )
        if entities is None:
            entities = _detect_entities(text)
        message = self._store_message(
            chat, sender, text, entities or None, message_thread_id, reply_to
        )
        return self.push_update({"message": message})

    def add_file(self, data: bytes, folder: str = "documents", suffix: str = "") -> JSONDict:
        """Store ``data`` for download; returns the file object fields (id, unique id, size)."""
        self._next_file += 1
        file_id = f"BQACAgF{self._next_file:06d}"
        path = f"{folder}/file_{self._next_file}{suffix}"
        self.files[path] = data
        self.file_ids[file_id] = (path, len(data))
        return {"file_id": file_id, "file_unique_id": f"AgAD{self._next_file:06d}",
                "file_size": len(data)}

    def add_unsized_file(self, size: int) -> JSONDict:
        """A file of ``size`` zero bytes, streamed in 64 KiB pieces as it is downloaded (how
        much went out: :attr:`streamed`) and never held in memory; ``getFile`` answers it
        without a ``file_size`` (the field is optional) and never as too big."""
        self._next_file += 1
        file_id = f"BQACAgG{self._next_file:06d}"
        path = f"documents/generated_{self._next_file}"
        self.generated[path] = size
        self.file_ids[file_id] = (path, 0)
        self._sizeless.add(file_id)
        return {"file_id": file_id, "file_unique_id": f"AgAG{self._next_file:06d}"}

    def user_media(
        self,
        chat_id: int,
        kind: str,
        data: bytes,
        *,
        caption: str | None = None,
        file_name: str | None = None,
        mime_type: str | None = None,
        declared_size: int | None = None,
        file: JSONDict | None = None,
        chat_type: str = "private",
        user_id: int | None = None,
        **fields: Any,
    ) -> JSONDict:
        """Push a message carrying a file, as Telegram builds it: ``kind`` is ``photo`` (three
        sizes, the last the full file), ``document``, ``voice``, ``audio``, ``video_note``,
        ``sticker``, ``video`` or ``animation``. ``declared_size`` overrides the size the
        update announces (for files past the download limit); ``file`` is a file object made
        before (:meth:`add_unsized_file`) to send instead of storing ``data``."""
        update = self.user_message(chat_id, "", chat_type=chat_type, user_id=user_id,
                                   entities=[])
        message = update["message"]
        del message["text"]
        message.pop("entities", None)
        stored = file if file is not None else self.add_file(
            data, {"photo": "photos", "voice": "voice"}.get(kind, "documents"))
        if declared_size is not None:
            stored["file_size"] = declared_size
        if kind == "photo":
            small = self.add_file(data[: max(1, len(data) // 16)], "photos")
            medium = self.add_file(data[: max(1, len(data) // 4)], "photos")
            message["photo"] = [{**small, "width": 90, "height": 67},
                                {**medium, "width": 320, "height": 240},
                                {**stored, "width": 1280, "height": 960}]
        else:
            obj: JSONDict = dict(stored)
            if file_name is not None:
                obj["file_name"] = file_name
            if mime_type is not None:
                obj["mime_type"] = mime_type
            if kind in ("voice", "audio", "video_note", "video", "animation"):
                obj["duration"] = 3
            if kind == "video_note":
                obj["length"] = 240
            if kind in ("video", "animation", "sticker"):
                obj.update(width=512, height=512)
            if kind == "sticker":
                obj.update(type="regular", is_animated=False, is_video=False, emoji="😀")
            obj.update(fields)
            message[kind] = obj
            if kind == "animation":
                message["document"] = dict(obj)  # Telegram sends a GIF as both
        if caption is not None:
            message["caption"] = caption
            entities = _detect_entities(caption)
            if entities:
                message["caption_entities"] = entities
        return update

    def messages_to(self, chat_id: int) -> list[JSONDict]:
        """The bot's messages currently in the chat (edits applied, deleted ones gone)."""
        return [
            message
            for (cid, _), message in sorted(self.messages.items())
            if cid == chat_id and message["from"]["id"] == self.bot_user["id"]
        ]

    def texts_to(self, chat_id: int) -> list[str]:
        return [message.get("text", "") for message in self.messages_to(chat_id)]

    def calls(self, method: str) -> list[SentCall]:
        """Recorded calls of one method (case-insensitive), failed ones included."""
        return [call for call in self.sent if call.method.lower() == method.lower()]

    async def wait_for_sent(
        self,
        predicate_or_count: Callable[[SentCall], bool] | int,
        timeout: float = 5.0,  # noqa: ASYNC109 - a plain float is the friendlier test API
    ) -> list[SentCall]:
        """Wait until ``len(sent) >= n`` or a call matches; returns the matching calls."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if isinstance(predicate_or_count, int):
                if len(self.sent) >= predicate_or_count:
                    return list(self.sent)
            else:
                matches = [call for call in self.sent if predicate_or_count(call)]
                if matches:
                    return matches
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                seen = [(c.method, c.chat_id, c.text, c.error_code) for c in self.sent]
                raise TimeoutError(f"no matching Bot API call within {timeout}s; saw {seen}")
            await self._sent_pulse.wait(remaining)

    def fail_next(
        self,
        method: str,
        error_code: int,
        description: str | None = None,
        retry_after: int | None = None,
        times: int = 1,
    ) -> None:
        """Make the next ``times`` calls of ``method`` ("*" = any) fail with this error.

        ``retry_after`` adds ``parameters.retry_after`` (PTB raises RetryAfter);
        409 -> Conflict, 400 -> BadRequest, 5xx -> NetworkError in PTB.
        """
        if description is None:
            if error_code == 429:
                description = f"Too Many Requests: retry after {retry_after or 1}"
            else:
                description = _DEFAULT_DESCRIPTIONS.get(error_code, "Unknown error")
        if error_code == 429 and retry_after is None:
            retry_after = 1
        fault = _Fault(error_code, description, retry_after, times)
        self._faults.setdefault(method.lower(), []).append(fault)

    def delay_next(self, method: str, seconds: float, times: int = 1) -> None:
        """Hold the next ``times`` calls of ``method`` for ``seconds`` (client timeouts)."""
        self._delays.setdefault(method.lower(), []).append(_Delay(seconds, times))

    def add_method(self, name: str, handler: MethodHandler) -> None:
        """Serve an extra Bot API method; the handler gets decoded params, returns result.

        Raise TelegramApiError from the handler for error answers.
        """
        self._extra_methods[name.lower()] = handler

    async def deliver_webhook(
        self,
        url: str,
        update: JSONDict,
        secret: str | None = None,
        timeout: float = 10.0,  # noqa: ASYNC109 - also bounds the HTTP request
    ) -> tuple[int, str]:
        """POST ``update`` to ``url`` as Telegram does; returns (HTTP status, body)."""
        if "update_id" not in update:
            update = {"update_id": self._next_update_id, **update}
            self._next_update_id += 1
        headers = {"Content-Type": "application/json"}
        if secret is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = secret
        session = self._require_session()
        async with session.post(
            url,
            data=orjson.dumps(update),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            self.last_headers = dict(response.headers)
            return response.status, await response.text()

    # ----------------------------------------------------------------- HTTP layer

    async def _stream_file(self, request: web.Request, path: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = self.generated[path]
        await response.prepare(request)
        piece = bytes(64 * 1024)
        self.streamed[path] = 0
        with contextlib.suppress(ConnectionError):
            while self.streamed[path] < self.generated[path]:
                part = piece[: self.generated[path] - self.streamed[path]]
                await response.write(part)
                self.streamed[path] += len(part)
            await response.write_eof()
        return response

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return _json_response(TelegramApiError(401, "Unauthorized").payload(), 401)
        path = request.match_info["path"]
        if path in self.generated:
            return await self._stream_file(request, path)
        data = self.files.get(path)
        if data is None:
            return _json_response(TelegramApiError(404, "Not Found").payload(), 404)
        try:
            await self.file_hold.passage("file")
        except Dropped:
            return web.Response(status=502, text="dropped")
        self.downloads.append(request.match_info["path"])
        return web.Response(body=data, content_type="application/octet-stream")

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return _json_response(TelegramApiError(401, "Unauthorized").payload(), 401)
        key = request.match_info["method"].lower()
        name, handler = self._resolve_method(key, request.match_info["method"])
        early_error: TelegramApiError | None = None
        try:
            params = await _read_params(request)
        except TelegramApiError as exc:
            params, early_error = {}, exc
        if handler is None:
            early_error = TelegramApiError(404, "Not Found")
        is_poll = key == "getupdates"
        if is_poll:
            self.get_updates_calls += 1
            self.last_get_updates_params = params

        result: Any = None
        error = early_error
        if error is None and handler is not None:
            await self._apply_delay(key)
            try:
                await self.outbound.passage(key, params)
            except Dropped:
                return _json_response(TelegramApiError(502, "Bad Gateway").payload(), 502)
            error = self._take_fault(key)
            if error is None:
                try:
                    result = await handler(params)
                except TelegramApiError as exc:
                    error = exc
                else:
                    self.outbound.applied(key, params, result)
        if not is_poll:
            self._record(name, params, result, error)
        if error is not None:
            return _json_response(error.payload(), error.error_code)
        return _json_response({"ok": True, "result": result}, 200)

    def _resolve_method(self, key: str, raw: str) -> tuple[str, MethodHandler | None]:
        if key in self._methods:
            return self._methods[key]
        if key in self._extra_methods:
            return raw, self._extra_methods[key]
        return raw, None

    async def _apply_delay(self, key: str) -> None:
        for queue_key in (key, "*"):
            queue = self._delays.get(queue_key)
            if queue:
                delay = queue[0]
                delay.remaining -= 1
                if delay.remaining <= 0:
                    queue.pop(0)
                await asyncio.sleep(delay.seconds)
                return

    def _take_fault(self, key: str) -> TelegramApiError | None:
        for queue_key in (key, "*"):
            queue = self._faults.get(queue_key)
            if queue:
                fault = queue[0]
                fault.remaining -= 1
                if fault.remaining <= 0:
                    queue.pop(0)
                return TelegramApiError(fault.error_code, fault.description, fault.retry_after)
        return None

    def _record(
        self, method: str, params: JSONDict, result: Any, error: TelegramApiError | None
    ) -> None:
        text = params.get("text")
        self.sent.append(
            SentCall(
                method=method,
                params=params,
                chat_id=params.get("chat_id"),
                text=text if isinstance(text, str) else None,
                time=time.time(),
                result=result,
                error_code=error.error_code if error else None,
                description=error.description if error else None,
            )
        )
        self._sent_pulse.fire()

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("FakeTelegramServer is not started (use 'async with')")
        return self._session

    # ----------------------------------------------------------------- updates

    async def _get_updates(self, params: JSONDict) -> list[JSONDict]:
        if self.webhook is not None:
            raise TelegramApiError(409, _WEBHOOK_CONFLICT)
        if "allowed_updates" in params:
            # Like the real server the setting persists for later calls.
            self.allowed_updates = list(params["allowed_updates"] or [])
        self._confirm(params.get("offset"))
        limit = min(max(int(params.get("limit") or 100), 1), 100)
        timeout = max(float(params.get("timeout") or 0), 0.0)

        # A newer getUpdates terminates an older one still waiting (409, as in reality).
        self._poll_generation += 1
        generation = self._poll_generation
        self._updates_pulse.fire()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.get_updates_active += 1
        try:
            while True:
                if generation != self._poll_generation:
                    raise TelegramApiError(409, _POLL_CONFLICT)
                if self.webhook is not None:
                    raise TelegramApiError(409, _WEBHOOK_CONFLICT)
                batch = self._deliverable(limit)
                remaining = deadline - loop.time()
                if batch or remaining <= 0 or self._closing:
                    return batch
                await self._updates_pulse.wait(remaining)
        finally:
            self.get_updates_active -= 1

    def _confirm(self, offset: Any) -> None:
        if not isinstance(offset, int) or offset == 0:
            return
        if offset > 0:
            self.confirmed_offset = max(self.confirmed_offset, offset)
            self.pending_updates = [u for u in self.pending_updates if u["update_id"] >= offset]
        else:
            # A negative offset keeps only the last -offset updates, forgetting the rest.
            self.pending_updates = self.pending_updates[offset:]

    def _deliverable(self, limit: int) -> list[JSONDict]:
        allowed = self.allowed_updates
        if self.webhook is not None and self.webhook.allowed_updates is not None:
            allowed = self.webhook.allowed_updates
        wanted = [u for u in self.pending_updates if _update_allowed(u, allowed)]
        # Updates of types the bot did not ask for are never delivered: drop them.
        self.pending_updates = wanted
        return wanted[:limit]

    # ----------------------------------------------------------------- webhooks

    async def _set_webhook(self, params: JSONDict) -> bool:
        url = params.get("url") or ""
        if not url:
            return await self._delete_webhook(params)
        secret = params.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise TelegramApiError(400, "Bad Request: secret token contains unallowed characters")
        if params.get("drop_pending_updates"):
            self.pending_updates.clear()
        self.webhook = WebhookConfig(
            url=url,
            secret_token=secret,
            max_connections=int(params.get("max_connections") or 40),
            allowed_updates=params.get("allowed_updates"),
            ip_address=params.get("ip_address"),
        )
        if self.webhook.allowed_updates is not None:
            self.allowed_updates = list(self.webhook.allowed_updates)
        self._updates_pulse.fire()  # pending long polls now fail with 409
        return True

    async def _delete_webhook(self, params: JSONDict) -> bool:
        self.webhook = None
        if params.get("drop_pending_updates"):
            self.pending_updates.clear()
        self._updates_pulse.fire()
        return True

    async def _get_webhook_info(self, params: JSONDict) -> JSONDict:
        info: JSONDict = {
            "url": self.webhook.url if self.webhook else "",
            "has_custom_certificate": False,
            "pending_update_count": len(self.pending_updates),
        }
        if self.webhook is not None:
            info["max_connections"] = self.webhook.max_connections
            if self.webhook.ip_address:
                info["ip_address"] = self.webhook.ip_address
            if self.webhook.allowed_updates is not None:
                info["allowed_updates"] = self.webhook.allowed_updates
            if self.webhook.last_error_date is not None:
                info["last_error_date"] = self.webhook.last_error_date
                info["last_error_message"] = self.webhook.last_error_message
        return info

    async def _webhook_worker(self) -> None:
        """Push pending updates to the webhook one at a time, like Telegram does."""
        while True:
            webhook = self.webhook
            batch = self._deliverable(1) if webhook and self.auto_deliver_webhook else []
            if webhook is None or not batch:
                await self._updates_pulse.wait(None)
                continue
            update = batch[0]
            if await self._push_to_webhook(webhook, update):
                self.pending_updates = [
                    u for u in self.pending_updates if u["update_id"] != update["update_id"]
                ]
            else:
                await asyncio.sleep(self.webhook_retry_delay)

    async def _push_to_webhook(self, webhook: WebhookConfig, update: JSONDict) -> bool:
        status: int | None = None
        error: str | None = None
        reply: JSONDict | None = None
        try:
            headers = {"Content-Type": "application/json"}
            if webhook.secret_token:
                headers["X-Telegram-Bot-Api-Secret-Token"] = webhook.secret_token
            async with self._require_session().post(
                webhook.url,
                data=orjson.dumps(update),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=10),
            ) as response:
                status = response.status
                if 200 <= status < 300 and response.content_type == "application/json":
                    body = await response.read()
                    parsed = orjson.loads(body) if body else None
                    reply = parsed if isinstance(parsed, dict) else None
                elif not 200 <= status < 300:
                    error = f"Wrong response from the webhook: {status} {response.reason}"
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            error = (
                "Connection refused"
                if isinstance(exc, aiohttp.ClientConnectorError)
                else str(exc or type(exc).__name__)
            )
        self.webhook_deliveries.append(
            WebhookDelivery(update["update_id"], webhook.url, status, error, time.time())
        )
        if error is not None:
            webhook.last_error_date = int(time.time())
            webhook.last_error_message = error
            return False
        if reply and isinstance(reply.get("method"), str):
            await self._run_webhook_reply(reply)
        return True

    async def _run_webhook_reply(self, reply: JSONDict) -> None:
        # Telegram executes a method returned in the webhook response body.
        params = _decode_params({k: v for k, v in reply.items() if k != "method"})
        name, handler = self._resolve_method(reply["method"].lower(), reply["method"])
        error: TelegramApiError | None = None
        result: Any = None
        if handler is None:
            error = TelegramApiError(404, "Not Found")
        else:
            try:
                result = await handler(params)
            except TelegramApiError as exc:
                error = exc
        self._record(name, params, result, error)

    # ----------------------------------------------------------------- messages

    async def _get_me(self, params: JSONDict) -> JSONDict:
        return dict(self.bot_user)

    async def _get_file(self, params: JSONDict) -> JSONDict:
        self.file_lookups.append(str(params.get("file_id")))
        found = self.file_ids.get(str(params.get("file_id")))
        if found is None:
            raise TelegramApiError(400, "Bad Request: invalid file_id")
        path, size = found
        if size > MAX_DOWNLOAD_BYTES:
            raise TelegramApiError(400, "Bad Request: file is too big")
        answer = {"file_id": params["file_id"], "file_unique_id": f"u{path}", "file_size": size,
                  "file_path": path}
        if params["file_id"] in self._sizeless:
            del answer["file_size"]
        return answer

    async def _send_document(self, params: JSONDict) -> JSONDict:
        chat = self._require_chat(params)
        document = params.get("document")
        if not isinstance(document, UploadedFile):
            raise TelegramApiError(400, "Bad Request: there is no document in the request")
        self.documents.append((chat["id"], document))
        message = self._store_message(chat, self.bot_user, "", None,
                                      params.get("message_thread_id"),
                                      self._resolve_reply(chat["id"], params))
        del message["text"]
        message["document"] = {**self.add_file(document.data), "file_name": document.filename,
                               "mime_type": document.content_type}
        return dict(message)

    async def _send_message(self, params: JSONDict) -> JSONDict:
        chat = self._require_chat(params)
        visible, entities = _format_text(params)
        if utf16_len(visible) > MAX_MESSAGE_UTF16:
            raise TelegramApiError(400, "Bad Request: message is too long")
        reply_to = self._resolve_reply(chat["id"], params)
        message = self._store_message(
            chat,
            self.bot_user,
            visible,
            entities,
            params.get("message_thread_id"),
            reply_to,
        )
        markup = params.get("reply_markup")
        if isinstance(markup, dict) and "inline_keyboard" in markup:
            message["reply_markup"] = markup  # only inline keyboards are echoed back
        return dict(message)

    async def _edit_message_text(self, params: JSONDict) -> JSONDict | bool:
        if params.get("inline_message_id"):
            _format_text(params)
            return True
        chat = self._require_chat(params)
        message = self.messages.get((chat["id"], _int_param(params, "message_id")))
        if message is None:
            raise TelegramApiError(400, "Bad Request: message to edit not found")
        if message["from"]["id"] != self.bot_user["id"]:
            raise TelegramApiError(400, "Bad Request: message can't be edited")
        visible, entities = _format_text(params)
        if utf16_len(visible) > MAX_MESSAGE_UTF16:
            raise TelegramApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        markup = params.get("reply_markup")
        if (
            message.get("text") == visible
            and message.get("entities") == entities
            and message.get("reply_markup") == markup
        ):
            raise TelegramApiError(400, _NOT_MODIFIED)
        message["text"] = visible
        message["edit_date"] = int(time.time())
        if entities:
            message["entities"] = entities
        else:
            message.pop("entities", None)
        if isinstance(markup, dict) and "inline_keyboard" in markup:
            message["reply_markup"] = markup
        else:
            message.pop("reply_markup", None)
        return dict(message)

    async def _delete_message(self, params: JSONDict) -> bool:
        chat = self._require_chat(params)
        key = (chat["id"], _int_param(params, "message_id"))
        if key not in self.messages:
            raise TelegramApiError(400, "Bad Request: message to delete not found")
        del self.messages[key]
        return True

    async def _send_chat_action(self, params: JSONDict) -> bool:
        self._require_chat(params)
        if params.get("action") not in _CHAT_ACTIONS:
            raise TelegramApiError(400, "Bad Request: wrong parameter action in request")
        return True

    async def _set_my_commands(self, params: JSONDict) -> bool:
        commands = params.get("commands")
        if not isinstance(commands, list):
            raise TelegramApiError(400, 'Bad Request: parameter "commands" is required')
        if len(commands) > 100:
            raise TelegramApiError(400, "Bad Request: BOT_COMMANDS_TOO_MUCH")
        for command in commands:
            if not isinstance(command, dict) or not _BOT_COMMAND_RE.fullmatch(
                str(command.get("command", ""))
            ):
                raise TelegramApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not 1 <= len(str(command.get("description", ""))) <= 256:
                raise TelegramApiError(400, "Bad Request: BOT_COMMAND_DESCRIPTION_INVALID")
        self.commands[_commands_key(params)] = [
            {"command": c["command"], "description": c["description"]} for c in commands
        ]
        return True

    async def _get_my_commands(self, params: JSONDict) -> list[JSONDict]:
        return list(self.commands.get(_commands_key(params), []))

    async def _delete_my_commands(self, params: JSONDict) -> bool:
        self.commands.pop(_commands_key(params), None)
        return True

    async def _get_chat(self, params: JSONDict) -> JSONDict:
        chat = self._require_chat(params)
        return {
            **chat,
            "accent_color_id": 0,
            "max_reaction_count": 11,
            "accepted_gift_types": {
                "unlimited_gifts": False,
                "limited_gifts": False,
                "unique_gifts": False,
                "premium_subscription": False,
                "gifts_from_channels": False,
            },
        }

    # ----------------------------------------------------------------- state helpers

    def _require_chat(self, params: JSONDict) -> JSONDict:
        chat_id = params.get("chat_id")
        if chat_id is None or chat_id == "":
            raise TelegramApiError(400, "Bad Request: chat_id is empty")
        if isinstance(chat_id, str):
            username = chat_id.removeprefix("@").lower()
            for chat in self.chats.values():
                if str(chat.get("username", "")).lower() == username:
                    return chat
            raise TelegramApiError(400, "Bad Request: chat not found")
        if chat_id in self.chats:
            return self.chats[chat_id]
        if self.strict_chats:
            raise TelegramApiError(400, "Bad Request: chat not found")
        return self.add_chat(chat_id, "private" if chat_id > 0 else "supergroup")

    def _resolve_reply(self, chat_id: int, params: JSONDict) -> JSONDict | None:
        reply = params.get("reply_parameters")
        if isinstance(reply, dict):
            target_chat = reply.get("chat_id", chat_id)
            message_id = reply.get("message_id")
            allow_missing = bool(reply.get("allow_sending_without_reply"))
        elif params.get("reply_to_message_id") is not None:
            target_chat = chat_id
            message_id = params["reply_to_message_id"]
            allow_missing = bool(params.get("allow_sending_without_reply"))
        else:
            return None
        target = self.messages.get((target_chat, message_id))  # type: ignore[arg-type]
        if target is None and not allow_missing:
            raise TelegramApiError(400, "Bad Request: message to be replied not found")
        return target

    def _latest_bot_message(self, chat_id: int, thread_id: int | None) -> JSONDict | None:
        candidates = [
            m
            for m in self.messages_to(chat_id)
            if thread_id is None or m.get("message_thread_id") == thread_id
        ]
        return candidates[-1] if candidates else None

    def _store_message(
        self,
        chat: JSONDict,
        sender: JSONDict,
        text: str,
        entities: list[JSONDict] | None,
        thread_id: int | None,
        reply_to: JSONDict | None,
    ) -> JSONDict:
        """Create a Message with the chat's next message_id (shared by both sides)."""
        message_id = self._next_message_id.get(chat["id"], 0) + 1
        self._next_message_id[chat["id"]] = message_id
        message: JSONDict = {
            "message_id": message_id,
            "from": dict(sender),
            "chat": dict(chat),
            "date": int(time.time()),
        }
        if thread_id is not None and chat.get("is_forum"):
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        if reply_to is not None:
            # Telegram nests only one level of reply_to_message.
            message["reply_to_message"] = {
                k: v for k, v in reply_to.items() if k != "reply_to_message"
            }
        message["text"] = text
        if entities:
            message["entities"] = entities
        self.messages[(chat["id"], message_id)] = message
        return message


# --------------------------------------------------------------------------------------
# Module helpers
# --------------------------------------------------------------------------------------


def _json_response(payload: JSONDict, status: int) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


async def _read_params(request: web.Request) -> JSONDict:
    """Merge query string and body (JSON, urlencoded or multipart) into typed params."""
    raw: JSONDict = dict(request.query)
    if request.method == "POST" and request.can_read_body:
        if request.content_type == "application/json":
            body = await request.read()
            if body:
                try:
                    data = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    raise TelegramApiError(400, "Bad Request: can't parse JSON") from exc
                if not isinstance(data, dict):
                    raise TelegramApiError(400, "Bad Request: JSON object expected")
                raw.update(data)
        else:
            form = await request.post()
            for key, value in form.items():
                if isinstance(value, web.FileField):
                    raw[key] = UploadedFile(value.filename, value.content_type, value.file.read())
                else:
                    raw[key] = value
    return _decode_params(raw)


def _decode_params(raw: JSONDict) -> JSONDict:
    """Type the parameters the way the Bot API does (PTB sends everything as strings)."""
    params: JSONDict = {}
    for key, value in raw.items():
        if isinstance(value, str) and key in _JSON_FIELDS:
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                raise TelegramApiError(
                    400, f"Bad Request: can't parse {key.replace('_', ' ')} JSON object"
                ) from exc
        elif isinstance(value, str) and key in _INT_FIELDS:
            with contextlib.suppress(ValueError):  # e.g. chat_id="@channelusername"
                value = int(value)
        elif isinstance(value, str) and key in _BOOL_FIELDS:
            value = value.lower() in ("true", "1")
        params[key] = value
    return params


def _int_param(params: JSONDict, key: str) -> int:
    value = params.get(key)
    if not isinstance(value, int):
        raise TelegramApiError(400, f"Bad Request: {key} is invalid")
    return value


def _format_text(params: JSONDict) -> tuple[str, list[JSONDict] | None]:
    """Apply parse_mode/entities to ``text``; raise the real API's 400 errors."""
    text = params.get("text")
    if not isinstance(text, str) or not text:
        raise TelegramApiError(400, "Bad Request: message text is empty")
    parse_mode = params.get("parse_mode")
    entities: list[JSONDict] | None = params.get("entities") or None
    if parse_mode:
        mode = str(parse_mode).lower()
        if mode == "html":
            try:
                text, parsed = parse_telegram_html(text)
            except HtmlParseError as exc:
                raise TelegramApiError(400, f"Bad Request: can't parse entities: {exc}") from exc
            entities = parsed or None
        elif mode not in ("markdown", "markdownv2"):
            raise TelegramApiError(400, "Bad Request: unsupported parse_mode")
    if not text.strip():
        raise TelegramApiError(400, "Bad Request: message text is empty")
    return text, entities


def _detect_entities(text: str) -> list[JSONDict]:
    found: list[JSONDict] = []
    for pattern, kind in ((_COMMAND_RE, "bot_command"), (_MENTION_RE, "mention")):
        for match in pattern.finditer(text):
            found.append(
                {
                    "type": kind,
                    "offset": utf16_len(text[: match.start()]),
                    "length": utf16_len(match.group()),
                }
            )
    return sorted(found, key=lambda e: e["offset"])


def _update_allowed(update: JSONDict, allowed: list[str] | None) -> bool:
    kinds = [key for key in update if key != "update_id"]
    kind = kinds[0] if kinds else ""
    if not allowed:
        return kind not in _OPT_IN_UPDATE_TYPES
    return kind in allowed


def _commands_key(params: JSONDict) -> tuple[str, str]:
    scope = params.get("scope") or {"type": "default"}
    return orjson.dumps(scope, option=orjson.OPT_SORT_KEYS).decode(), str(
        params.get("language_code") or ""
    )


__all__ = [
    "MAX_MESSAGE_UTF16",
    "FakeTelegramServer",
    "HtmlParseError",
    "SentCall",
    "TelegramApiError",
    "UploadedFile",
    "WebhookConfig",
    "WebhookDelivery",
    "parse_telegram_html",
    "utf16_len",
]
