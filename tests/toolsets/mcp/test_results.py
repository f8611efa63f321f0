"""MCP tool results as the model gets them: text as is, images (and image or PDF resources)
as files for the blob store, other binary content as a placeholder, resources named,
structured content as JSON, errors flagged, oversize refused."""

from __future__ import annotations

import base64
import hashlib

from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from gateway.edge.tools import ToolMedia
from toolsets.mcp.results import to_tool_result


def test_mixed_content_becomes_text_and_files() -> None:
    """Text, an image, an embedded text resource, an image resource, an unknown blob, audio
    and a link, in order: images become files named after the tool with a line where they
    were; binary content no model reads stays a placeholder; the same result, the same
    answer."""
    png = base64.b64encode(b"\x89PNG-data").decode()
    digest = hashlib.sha256(b"\x89PNG-data").hexdigest()[:16]
    result = CallToolResult(content=[
        TextContent(text="Here:"),
        ImageContent(data=png, mime_type="image/png"),
        EmbeddedResource(resource=TextResourceContents(uri="file:///a.txt", text="alpha")),
        EmbeddedResource(resource=BlobResourceContents(uri="file:///c.png", blob=png,
                                                       mime_type="image/png")),
        EmbeddedResource(resource=BlobResourceContents(uri="file:///b.bin", blob=png,
                                                       mime_type="application/x-b")),
        AudioContent(data=png, mime_type="audio/wav"),
        ResourceLink(name="spec", uri="https://example.com/spec", mime_type="text/html"),
    ])
    out = to_tool_result(result, 10_000, "snap shot")
    assert (out.is_error, out.kind) == (False, "ok")
    assert out.text.split("\n") == [
        "Here:",
        "[image: snap_shot-1]",
        "[resource <file:///a.txt>]",
        "alpha",
        "[resource <file:///c.png>]",
        "[image: snap_shot-2]",
        f"[resource <file:///b.bin>, application/x-b, 9 bytes, sha256:{digest}: "
        "not shown to the model]",
        f"[audio, audio/wav, 9 bytes, sha256:{digest}: not shown to the model]",
        "[resource link: spec <https://example.com/spec> (text/html)]",
    ]
    assert out.media == (ToolMedia(b"\x89PNG-data", "image/png", "snap_shot-1"),
                         ToolMedia(b"\x89PNG-data", "image/png", "snap_shot-2"))
    assert to_tool_result(result, 10_000, "snap shot") == out


def test_undecodable_images_and_error_results() -> None:
    """An image whose base64 is broken is one line, never a file; an error result keeps the
    image it came with (a screenshot of the failure is worth seeing)."""
    broken = to_tool_result(CallToolResult(content=[
        ImageContent(data="not base64!", mime_type="image/png")]), 100, "shot")
    assert (broken.text, broken.media) == ("[image, image/png: undecodable data, not shown]", ())
    png = base64.b64encode(b"\x89PNG").decode()
    failed = to_tool_result(CallToolResult(content=[
        TextContent(text="the page did not load"), ImageContent(data=png, mime_type="image/png"),
    ], is_error=True), 100, "shot")
    assert (failed.kind, failed.text) == ("error", "the page did not load\n[image: shot-1]")
    assert failed.media == (ToolMedia(b"\x89PNG", "image/png", "shot-1"),)


def test_structured_only_errors_and_oversize() -> None:
    """Structured content without blocks is sorted JSON; isError is an error result; a text
    over the cap is an oversize error saying how large it was."""
    structured = to_tool_result(CallToolResult(content=[], structured_content={"b": 1, "a": 2}),
                                100)
    assert structured.text == '{"a":2,"b":1}'
    failed = to_tool_result(CallToolResult(content=[TextContent(text="no such ticket")],
                                           is_error=True), 100)
    assert (failed.text, failed.is_error, failed.kind) == ("no such ticket", True, "error")
    big = to_tool_result(CallToolResult(content=[TextContent(text="x" * 101)]), 100)
    assert (big.is_error, big.kind) == (True, "oversize")
    assert big.text == "the tool's result was too large (101 characters; the limit is 100)"
