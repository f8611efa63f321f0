"""MCP tool results as model text: text as is, binary content as a placeholder, resources
named, structured content as JSON, errors flagged, oversize refused."""

from __future__ import annotations

import base64
import hashlib

from mcp_types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from toolsets.mcp.results import to_tool_result


def test_mixed_content_becomes_one_deterministic_text() -> None:
    """Text, an image, an embedded text resource, a blob and a link, in order."""
    png = base64.b64encode(b"\x89PNG-data").decode()
    digest = hashlib.sha256(b"\x89PNG-data").hexdigest()[:16]
    result = CallToolResult(content=[
        TextContent(text="Here:"),
        ImageContent(data=png, mime_type="image/png"),
        EmbeddedResource(resource=TextResourceContents(uri="file:///a.txt", text="alpha")),
        EmbeddedResource(resource=BlobResourceContents(uri="file:///b.bin", blob=png,
                                                       mime_type="application/x-b")),
        ResourceLink(name="spec", uri="https://example.com/spec", mime_type="text/html"),
    ])
    out = to_tool_result(result, 10_000)
    assert (out.is_error, out.kind) == (False, "ok")
    assert out.text.split("\n") == [
        "Here:",
        f"[image, image/png, 9 bytes, sha256:{digest}: not shown to the model]",
        "[resource <file:///a.txt>]",
        "alpha",
        f"[resource <file:///b.bin>, application/x-b, 9 bytes, sha256:{digest}: "
        "not shown to the model]",
        "[resource link: spec <https://example.com/spec> (text/html)]",
    ]
    assert to_tool_result(result, 10_000) == out


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
