"""An MCP tool result as the model gets it (and the log records it).

Text blocks are passed as they are, joined by newlines. Embedded text resources come with a
line naming their URI; resource links are one line. Images, and binary resources that say they
are images or PDFs, become :class:`~gateway.edge.tools.ToolMedia` (named ``TOOL-N``, with a
``[image: TOOL-N]`` line where they were): the core stores them in the blob store and the model
sees them as images or documents, never as base64 text. Audio and other binary resources
become a one-line placeholder with their type, size and a short SHA-256 (no provider reads
audio in a tool result). With no content blocks, structured content is given as compact JSON.
Everything is deterministic: the same result gives the same text and files, so replay and
``--live-tools`` compare.

Above the size cap the text makes the result an error telling the model how large it was,
never a cut text it might take for the whole (files have their own cap, checked when stored).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

import orjson
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from gateway.edge.tools import ToolMedia, ToolResult

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NAME_LIMIT = 64
"""A file's name is its tool's name (safe characters only, bounded) and its number."""


def to_tool_result(result: CallToolResult, max_chars: int, tool: str = "result") -> ToolResult:
    """``result`` as the model sees it; oversize answers become an ``oversize`` error.
    ``tool`` (the tool's name at its server) names the files it returned."""
    media: list[ToolMedia] = []
    parts = [_block_text(block, tool, media) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(orjson.dumps(result.structured_content,
                                  option=orjson.OPT_SORT_KEYS).decode())
    text = "\n".join(parts)
    if len(text) > max_chars:
        return ToolResult(f"the tool's result was too large ({len(text)} characters; the "
                          f"limit is {max_chars})", is_error=True, outcome="oversize")
    if result.is_error:
        return ToolResult(text or "the tool reported an error without a message",
                          is_error=True, media=tuple(media))
    return ToolResult(text, media=tuple(media))


def _block_text(block: ContentBlock, tool: str, media: list[ToolMedia]) -> str:
    """The text standing for ``block``; a file the model can see is added to ``media``."""
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent):
        return _medium("image", block.mime_type, block.data, tool, media)
    if isinstance(block, AudioContent):
        return placeholder("audio", block.mime_type, block.data)
    if isinstance(block, ResourceLink):
        mime = f" ({block.mime_type})" if block.mime_type else ""
        return f"[resource link: {block.name} <{block.uri}>{mime}]"
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, TextResourceContents):
            return f"[resource <{resource.uri}>]\n{resource.text}"
        if isinstance(resource, BlobResourceContents):
            kind = _visible(resource.mime_type)
            if kind is not None:
                shown = _medium(kind, resource.mime_type, resource.blob, tool, media)
                return f"[resource <{resource.uri}>]\n{shown}"
            return placeholder(f"resource <{resource.uri}>", resource.mime_type, resource.blob)
    return f"[{getattr(block, 'type', 'unknown')} content: not shown]"


def _visible(mime: str | None) -> str | None:
    """``image`` or ``document`` for a claimed type the model can be shown, else None (the
    bytes are sniffed again when stored: the claim only picks the path)."""
    if mime is None:
        return None
    if mime.startswith("image/"):
        return "image"
    return "document" if mime == "application/pdf" else None


def _medium(kind: str, mime: str | None, data: str, tool: str, media: list[ToolMedia]) -> str:
    """Decode a file for the keeper; its line in the text (a placeholder if undecodable)."""
    raw = _decoded(data)
    if raw is None:
        return _undecodable(kind, mime)
    name = f"{_UNSAFE.sub('_', tool)[:_NAME_LIMIT]}-{len(media) + 1}"
    media.append(ToolMedia(raw, mime or "", name))
    return f"[{kind}: {name}]"


def placeholder(kind: str, mime: str | None, data: str) -> str:
    """One line standing for binary content: what it is, how big, and a short hash."""
    raw = _decoded(data)
    if raw is None:
        return _undecodable(kind, mime)
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return (f"[{kind}, {mime or 'unknown type'}, {len(raw)} bytes, sha256:{digest}: "
            "not shown to the model]")


def _decoded(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _undecodable(kind: str, mime: str | None) -> str:
    return f"[{kind}, {mime or 'unknown type'}: undecodable data, not shown]"
