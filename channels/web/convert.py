"""Pure translation for the web channel: request bodies and query values in, records out.

No I/O here: :mod:`channels.web.channel` reads requests and writes responses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.history import HistoryItem
from gateway.ids import InvalidIdError, valid_id

MAX_NAME_CHARS = 80
MAX_CLIENT_ID_CHARS = 128
# Cc characters except \t and \n: they garble logs and terminals and mean nothing in a chat.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class BadRequest(Exception):
    """Input the API refuses; ``status`` is the HTTP status, the message goes to the client."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated ``POST /api/chat`` body."""

    conversation: str
    text: str
    name: str | None = None
    client_id: str | None = None
    stream: bool = False


def clean_text(text: str) -> str:
    """``text`` without control characters other than newline and tab."""
    return _CONTROL.sub("", text)


def parse_chat(raw: bytes, max_chars: int) -> ChatRequest:
    """Validate a chat request body (pure); raises :class:`BadRequest`."""
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest("request body is not valid UTF-8") from exc
    try:
        body = orjson.loads(decoded)
    except orjson.JSONDecodeError as exc:
        raise BadRequest("request body is not valid JSON") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    conversation = conversation_id(body.get("conversation"))
    text = body.get("text")
    if not isinstance(text, str):
        raise BadRequest('"text" is required and must be a string')
    if len(text) > max_chars:
        raise BadRequest(
            f"message is {len(text)} characters long; the limit is {max_chars}", status=413
        )
    text = clean_text(text)
    if not text.strip():
        raise BadRequest('"text" is empty')
    name = body.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise BadRequest('"name" must be a string')
        name = " ".join(clean_text(name).split())[:MAX_NAME_CHARS] or None
    client_id = body.get("id")
    if client_id is not None:
        if not isinstance(client_id, str) or not 0 < len(client_id) <= MAX_CLIENT_ID_CHARS:
            raise BadRequest(f'"id" must be a string of 1 to {MAX_CLIENT_ID_CHARS} characters')
        if _CONTROL.search(client_id):
            raise BadRequest('"id" contains control characters')
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest('"stream" must be true or false')
    return ChatRequest(conversation, text, name, client_id, stream)


def conversation_id(value: object) -> str:
    if not isinstance(value, str):
        raise BadRequest('"conversation" is required and must be a string')
    try:
        return valid_id(value, "conversation id")
    except InvalidIdError as exc:
        raise BadRequest(str(exc)) from exc


def history_item(item: HistoryItem) -> dict[str, Any]:
    """One message of a history page as the API shows it.

    ``text`` is ``None`` for messages without text (tool calls and tool results).
    """
    return {"seq": item.seq, "ts": item.ts, "role": item.role, "text": item.text}






def int_param(query: Mapping[str, str], name: str, default: int) -> int:
    """A non-negative integer query parameter; ``default`` when absent or empty."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise BadRequest(f'"{name}" must be a whole number >= 0')
    return int(raw)
