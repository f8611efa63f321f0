"""An MCP tool result as the text the model gets (and the log records).

Text blocks are passed as they are, joined by newlines. Embedded text resources come with a
line naming their URI; resource links are one line. Images, audio and binary resources become
a one-line placeholder with their type, size and a short SHA-256: there is no blob store in
the log yet, and base64 in the transcript would cost the model tokens for nothing it can read
as text. With no content blocks, structured content is given as compact JSON. Everything is
deterministic: the same result gives the same text, so replay and ``--live-tools`` compare.

Above the size cap the result is an error telling the model how large it was, never a cut
text it might take for the whole.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

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

from gateway.tools import ToolResult


def to_tool_result(result: CallToolResult, max_chars: int) -> ToolResult:
    """``result`` as the model sees it; oversize answers become an ``oversize`` error."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(orjson.dumps(result.structured_content,
                                  option=orjson.OPT_SORT_KEYS).decode())
    text = "\n".join(parts)
    if len(text) > max_chars:
        return ToolResult(f"the tool's result was too large ({len(text)} characters; the "
                          f"limit is {max_chars})", is_error=True, outcome="oversize")
    if result.is_error:
        return ToolResult(text or "the tool reported an error without a message",
                          is_error=True)
    return ToolResult(text)


def _block_text(block: ContentBlock) -> str:
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent | AudioContent):
        kind = "image" if isinstance(block, ImageContent) else "audio"
        return placeholder(kind, block.mime_type, block.data)
    if isinstance(block, ResourceLink):
        mime = f" ({block.mime_type})" if block.mime_type else ""
        return f"[resource link: {block.name} <{block.uri}>{mime}]"
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, TextResourceContents):
            return f"[resource <{resource.uri}>]\n{resource.text}"
        if isinstance(resource, BlobResourceContents):
            return placeholder(f"resource <{resource.uri}>", resource.mime_type, resource.blob)
    return f"[{getattr(block, 'type', 'unknown')} content: not shown]"


def placeholder(kind: str, mime: str | None, data: str) -> str:
    """One line standing for binary content: what it is, how big, and a short hash."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{kind}, {mime or 'unknown type'}: undecodable data, not shown]"
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return (f"[{kind}, {mime or 'unknown type'}, {len(raw)} bytes, sha256:{digest}: "
            "not shown to the model]")
