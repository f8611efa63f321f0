"""Attachment references in messages, and the provider blocks they become (pure).

A message entry never holds an attachment's bytes. A content block refers to them by the
sha256 of the bytes kept in the blob store (:mod:`sessions.blobs`)::

    {"type": "attachment", "hash": "<64 hex>", "name": "photo.jpg",
     "media_type": "image/jpeg", "size": 48213}

``media_type`` is the type sniffed from the bytes (never the sender's claim) and decides what
the block becomes at send time. Optional fields: ``transcript`` (voice and audio: the text the
transcription model heard, which is what the provider is sent) and ``sent`` (``true`` inside a
``tool_result``: a file the agent sent to the person, recorded but never sent to a provider).
A reference inside a ``tool_result`` without ``sent`` is a file a tool returned for the model
to see (an MCP server's image): it is expanded like a person's attachment.

:func:`expand_anthropic` and :func:`expand_openai` turn references into provider blocks with the
bytes given in a ``blobs`` mapping (hash -> bytes). Live calls and replay use these same
functions, so a replayed body equals the sent one image for image; a reference whose bytes are
not in ``blobs`` raises :class:`~sessions.errors.BlobMissingError` naming the hash.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from sessions.errors import BlobMissingError

ATTACHMENT: Final = "attachment"
HASH_PATTERN: Final = re.compile(r"[0-9a-f]{64}")
IMAGE_TYPES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Image types both providers take; others are converted (or refused) before storing."""
PDF: Final = "application/pdf"

Category = Literal["image", "pdf", "audio", "text", "other"]


@dataclass(frozen=True, slots=True)
class BlobRef:
    """What a message says about one attachment (everything but its bytes)."""

    hash: str
    name: str
    media_type: str
    size: int

    def label(self) -> str:
        """``photo.jpg, image/jpeg, 48.2 KB``: which attachment, for people and errors."""
        return f"{self.name}, {self.media_type}, {human_size(self.size)}"


def category(media_type: str) -> Category:
    """How an attachment of this (sniffed) type reaches a model."""
    if media_type in IMAGE_TYPES:
        return "image"
    if media_type == PDF:
        return "pdf"
    if media_type.startswith("audio/") or media_type == "video/mp4":  # video notes: as audio
        return "audio"
    if media_type.startswith("text/"):
        return "text"
    return "other"


def human_size(size: int) -> str:
    """``812 bytes``, ``48.2 KB``, ``3.1 MB`` (powers of 1024)."""
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def ref_block(ref: BlobRef, *, transcript: str | None = None, sent: bool = False) -> dict[str, Any]:
    """The content block that refers to ``ref`` (see the module docstring)."""
    block: dict[str, Any] = {"type": ATTACHMENT, "hash": ref.hash, "name": ref.name,
                             "media_type": ref.media_type, "size": ref.size}
    if transcript is not None:
        block["transcript"] = transcript
    if sent:
        block["sent"] = True
    return block


def ref_of(block: Any) -> BlobRef | None:
    """The reference a block holds, or None when it is not a well-formed attachment block."""
    if not isinstance(block, dict) or block.get("type") != ATTACHMENT:
        return None
    digest, name, media_type, size = (block.get("hash"), block.get("name"),
                                      block.get("media_type"), block.get("size"))
    if not (isinstance(digest, str) and HASH_PATTERN.fullmatch(digest)
            and isinstance(name, str) and isinstance(media_type, str)
            and type(size) is int and size >= 0):
        return None
    return BlobRef(digest, name, media_type, size)


def iter_refs(content: Any, *, include_sent: bool = True) -> Iterator[tuple[BlobRef, bool]]:
    """``(ref, sent)`` for every attachment block in a message's content, tool results
    included, in order."""
    if not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_result":
            yield from iter_refs(block.get("content"), include_sent=include_sent)
            continue
        ref = ref_of(block)
        if ref is None:
            continue
        sent = block.get("sent") is True
        if include_sent or not sent:
            yield ref, sent


def needed(messages: Iterable[Mapping[str, Any]]) -> list[BlobRef]:
    """The blobs a provider body built from ``messages`` needs (sent files excluded), each
    once, in order of first use."""
    seen: dict[str, BlobRef] = {}
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):  # plain text, most messages: nothing to walk
            continue
        for ref, _sent in iter_refs(content, include_sent=False):
            seen.setdefault(ref.hash, ref)
    return list(seen.values())


def referenced(data: bytes) -> set[str]:
    """Every blob hash a session log's message entries refer to (sent files included).

    Used by retention (``sessions prune``) and by the endpoints that serve a blob only to
    someone who can see a session that refers to it. Corrupt lines are skipped.
    """
    found: set[str] = set()
    for raw in data.split(b"\n"):
        # Cheap pre-filter: only lines mentioning an attachment need parsing.
        if b'"attachment"' not in raw:
            continue
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(entry, dict) or entry.get("type") != "message":
            continue
        message = entry.get("message")
        if isinstance(message, dict):
            found.update(ref.hash for ref, _ in iter_refs(message.get("content")))
    return found


# -- expansion -----------------------------------------------------------------------------------


def has_refs(content: Any) -> bool:
    """True when a content list holds an attachment block (directly or in a tool result)."""
    if not isinstance(content, list):
        return False
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == ATTACHMENT:
            return True
        if kind == "tool_result" and has_refs(block.get("content")):
            return True
    return False


def expand_anthropic(content: Sequence[Any], blobs: Mapping[str, bytes]) -> list[Any]:
    """A content list with every attachment block replaced by its Anthropic blocks."""
    out: list[Any] = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result" \
                and has_refs(block.get("content")):
            out.append({**block, "content": expand_anthropic(block["content"], blobs)})
            continue
        ref = ref_of(block)
        if ref is None:
            if isinstance(block, dict) and block.get("type") == ATTACHMENT:
                raise ValueError("an attachment block is malformed")
            out.append(block)
            continue
        if block.get("sent") is True:
            continue  # a file the agent sent: its tool result says so; never sent back
        kind = category(ref.media_type)
        if kind == "image":
            out.append({"type": "image", "source": {
                "type": "base64", "media_type": ref.media_type, "data": _b64(ref, blobs)}})
        elif kind == "pdf":
            out.append({"type": "document", "source": {
                "type": "base64", "media_type": PDF, "data": _b64(ref, blobs)}, "title": ref.name})
        else:
            out.append({"type": "text", "text": text_of(block, ref, blobs)})
    return out


def expand_openai(content: Sequence[Any], blobs: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """A user message's text and attachment blocks as Chat Completions content parts."""
    parts: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
            continue
        if kind != ATTACHMENT:
            continue  # tool results become tool messages; other blocks have no OpenAI form
        ref = ref_of(block)
        if ref is None:
            raise ValueError("an attachment block is malformed")
        if block.get("sent") is True:
            continue
        what = category(ref.media_type)
        if what == "image":
            url = f"data:{ref.media_type};base64,{_b64(ref, blobs)}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif what == "pdf":
            parts.append({"type": "file", "file": {
                "filename": ref.name, "file_data": f"data:{PDF};base64,{_b64(ref, blobs)}"}})
        else:
            parts.append({"type": "text", "text": text_of(block, ref, blobs)})
    return parts


def text_of(block: Mapping[str, Any], ref: BlobRef, blobs: Mapping[str, bytes]) -> str:
    """The text a model reads for a text file or a transcribed voice note."""
    name = _attr(ref.name)
    transcript = block.get("transcript")
    if isinstance(transcript, str):
        return (f'<transcript of="{name}" media_type="{ref.media_type}">\n'
                f"{transcript}\n</transcript>")
    if category(ref.media_type) == "text":
        text = _bytes(ref, blobs).decode("utf-8", errors="replace")
        return f'<file name="{name}" media_type="{ref.media_type}">\n{text}\n</file>'
    # Not written by the gateway (audio is stored with its transcript, other types refused);
    # a hand-made log still gets a deterministic, honest body.
    return f'<file name="{name}" media_type="{ref.media_type}">(content not readable)</file>'


def _attr(value: str) -> str:
    """A value safe inside the double quotes of the pseudo-tags above."""
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


def _bytes(ref: BlobRef, blobs: Mapping[str, bytes]) -> bytes:
    data = blobs.get(ref.hash)
    if data is None:
        raise BlobMissingError(ref.hash, ref.label())
    return data


def _b64(ref: BlobRef, blobs: Mapping[str, bytes]) -> str:
    return base64.b64encode(_bytes(ref, blobs)).decode("ascii")
