"""Pure translation for the web channel: request bodies and query values in, records out.

No I/O here: :mod:`channels.web.channel` reads requests and writes responses.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from gateway.edge.history import HistoryFile, HistoryItem
from gateway.edge.ids import MAX_NAME_LENGTH, InvalidIdError, valid_id
from gateway.edge.messages import Attachment

MAX_NAME_CHARS = 80
MAX_CLIENT_ID_CHARS = 128
MAX_ATTACHMENTS = 100
"""Files one request may carry at all (the gateway reads ``GATEWAY_MAX_ATTACHMENTS`` of them
and tells the person about the rest); beyond this the request is refused outright."""
_HASH = re.compile(r"[0-9a-f]{64}")
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
    attachments: tuple[Attachment, ...] = ()


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
    return chat_request(body, json_attachments(body.get("attachments")), max_chars)


def json_attachments(raw: object) -> tuple[Attachment, ...]:
    """``"attachments": [{"name", "media_type", "data": base64}]`` as attachments."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRequest('"attachments" must be a list')
    if len(raw) > MAX_ATTACHMENTS:
        raise BadRequest(f"at most {MAX_ATTACHMENTS} attachments per request", status=413)
    found: list[Attachment] = []
    for position, item in enumerate(raw, start=1):
        where = f"attachment {position}"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object")
        name, media_type, data = item.get("name"), item.get("media_type"), item.get("data")
        if not isinstance(data, str):
            raise BadRequest(f'{where}: "data" is required: the file as base64')
        if name is not None and not isinstance(name, str):
            raise BadRequest(f'{where}: "name" must be a string')
        if media_type is not None and not isinstance(media_type, str):
            raise BadRequest(f'{where}: "media_type" must be a string')
        try:
            decoded = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadRequest(f'{where}: "data" is not valid base64') from exc
        found.append(Attachment(name or "file", media_type or "application/octet-stream",
                                decoded, kind="file", size=len(decoded)))
    return tuple(found)


def form_attachments(
    files: Sequence[tuple[str | None, str | None, bytes]],
) -> tuple[Attachment, ...]:
    """The file parts of a ``multipart/form-data`` request (name, content type, bytes)."""
    if len(files) > MAX_ATTACHMENTS:
        raise BadRequest(f"at most {MAX_ATTACHMENTS} attachments per request", status=413)
    return tuple(Attachment(name or "file", media_type or "application/octet-stream", data,
                            kind="file", size=len(data)) for name, media_type, data in files)


def form_fields(fields: Mapping[str, str]) -> dict[str, Any]:
    """The text fields of a multipart request as the JSON body would carry them."""
    body: dict[str, Any] = {key: fields[key] for key in ("conversation", "text", "name", "id")
                            if key in fields}
    stream = fields.get("stream")
    if stream is not None:
        if stream not in ("true", "false"):
            raise BadRequest('"stream" must be true or false')
        body["stream"] = stream == "true"
    return body


def chat_request(body: Mapping[str, Any], attachments: tuple[Attachment, ...],
                 max_chars: int) -> ChatRequest:
    """Validate the fields of a chat request, from JSON or a form (pure); raises
    :class:`BadRequest`. ``text`` may be empty (or absent) when files come with it."""
    conversation = conversation_id(body.get("conversation"))
    text = body.get("text", "" if attachments else None)
    if not isinstance(text, str):
        raise BadRequest('"text" is required and must be a string')
    if len(text) > max_chars:
        raise BadRequest(
            f"message is {len(text)} characters long; the limit is {max_chars}", status=413
        )
    text = clean_text(text)
    if not text.strip() and not attachments:
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
    return ChatRequest(conversation, text, name, client_id, stream, attachments)


def conversation_id(value: object) -> str:
    if not isinstance(value, str):
        raise BadRequest('"conversation" is required and must be a string')
    try:
        return valid_id(value, "conversation id")
    except InvalidIdError as exc:
        raise BadRequest(str(exc)) from exc


def own_conversation(person: str, conversation: str) -> str:
    """The name the gateway keys ``person``'s conversation ``conversation`` by:
    ``<person>.<conversation>``. The client chooses the conversation id, so two people who
    pick the same one (or one who guesses another's) must still get two conversations: the
    person (the server's to say, :mod:`channels.web.identity`) comes first. A person id never
    holds a ``.``, so the split is unambiguous. A name that would pass the length bound on
    names keeps the person and a hash of the client's id instead."""
    own = f"{person}.{conversation}"
    if len(own) <= MAX_NAME_LENGTH:
        return own
    return f"{person}.h-{hashlib.sha256(conversation.encode()).hexdigest()[:40]}"


def history_item(item: HistoryItem, conversation: str) -> dict[str, Any]:
    """One message of a history page as the API shows it.

    ``text`` is ``None`` for messages without text (tool calls and tool results); ``files``
    lists the message's attachments (and files the agent sent), each with its download URL;
    ``"scheduled": true`` marks a scheduled turn's trigger (a reminder firing: nobody typed it).
    """
    shown = {"seq": item.seq, "ts": item.ts, "role": item.role, "text": item.text,
             "files": [file_json(f, conversation) for f in item.files]}
    return {**shown, "scheduled": True} if item.scheduled else shown


def file_json(file: HistoryFile, conversation: str) -> dict[str, Any]:
    """A file as the page shows it: name, type, size, hash and where to fetch it."""
    return {"name": file.name, "media_type": file.media_type, "size": file.size,
            "hash": file.hash, "sent": file.sent,
            "url": f"/api/file?conversation={quote(conversation)}&hash={file.hash}"}


def blob_hash(value: object) -> str:
    """A ``hash`` query value: 64 lowercase hex characters."""
    if not isinstance(value, str) or _HASH.fullmatch(value) is None:
        raise BadRequest('"hash" must be 64 lowercase hex characters')
    return value






def int_param(query: Mapping[str, str], name: str, default: int) -> int:
    """A non-negative integer query parameter; ``default`` when absent or empty."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise BadRequest(f'"{name}" must be a whole number >= 0')
    return int(raw)
