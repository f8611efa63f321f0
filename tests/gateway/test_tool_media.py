"""Files tools return (an MCP server's images): sniffed, fitted to the provider's limits and
stored once per tenant like attachments, the result holding references; anything unusable is
a note in the result's text, never an exception; without a keeper, only notes."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from gateway.agent.tools import ToolRegistry, run_tool_uses
from gateway.edge.messages import ChannelContext
from gateway.edge.metrics import Metrics
from gateway.edge.tools import ToolMedia, ToolResult
from gateway.media.images import IMAGE_LIMITS
from gateway.media.policy import MediaLimits
from gateway.media.tool_media import ToolMediaKeeper
from sessions.attachments import human_size
from sessions.blob_files import FileBlobStore
from tests.fakes import media
from tests.gateway.test_intake import FullBlobStore

ACME = ChannelContext(channel="web", chat_type="private", speaker="ada", tenant="acme")
SMALL = media.png(8, 6)


def keeper(tmp_path: Path, shape: str = "anthropic", **limits: Any) -> ToolMediaKeeper:
    return ToolMediaKeeper(FileBlobStore(tmp_path / "data"), limits=MediaLimits(**limits),
                           images=IMAGE_LIMITS[shape])


def ref(data: bytes, name: str, media_type: str) -> dict[str, Any]:
    return {"type": "attachment", "hash": hashlib.sha256(data).hexdigest(), "name": name,
            "media_type": media_type, "size": len(data)}


async def test_images_and_pdfs_are_stored_and_referenced(tmp_path: Path) -> None:
    """A small PNG is kept byte for byte, a PDF as a document, both stored under the tenant
    and referenced in order after the text; the result carries no bytes any more."""
    keep = keeper(tmp_path)
    result = ToolResult("see [image: shot-1] and [document: shot-2]", media=(
        ToolMedia(SMALL, "image/png", "shot-1"), ToolMedia(media.PDF, "application/pdf", "shot-2")))
    kept = await keep.keep(result, "acme")
    assert kept.text == result.text
    assert kept.media == ()
    assert kept.attachments == (ref(SMALL, "shot-1", "image/png"),
                                ref(media.PDF, "shot-2", "application/pdf"))
    assert kept.content() == [{"type": "text", "text": result.text}, *kept.attachments]
    assert await keep.blobs.get("acme", hashlib.sha256(SMALL).hexdigest()) == SMALL
    assert await keep.blobs.list_blobs("default") == []
    again = await keep.keep(result, "acme")  # the same bytes: the same references, stored once
    assert again == kept
    assert len(await keep.blobs.list_blobs("acme")) == 2


async def test_an_image_over_the_limits_is_fitted_for_the_provider(tmp_path: Path) -> None:
    """An image wider than the provider takes is scaled to its long-edge limit and
    re-encoded; the stored bytes are exactly the referenced (and sent) bytes."""
    wide = media.png(4000, 100)
    for shape in ("anthropic", "openai"):
        keep = keeper(tmp_path / shape, shape)
        kept = await keep.keep(ToolResult("[image: wide-1]",
                                          media=(ToolMedia(wide, "image/png", "wide-1"),)), "t")
        (block,) = kept.attachments
        stored = await keep.blobs.get("t", block["hash"])
        assert block == ref(stored, "wide-1", "image/jpeg")
        assert Image.open(io.BytesIO(stored)).size[0] == IMAGE_LIMITS[shape].max_edge


async def test_unusable_files_become_notes(tmp_path: Path) -> None:
    """A lying type (text claimed as PNG), an archive, an empty file, one over the byte limit
    and one too many are each named in a note with the reason; the good one is kept."""
    keep = keeper(tmp_path, max_bytes=10_000, max_count=5)
    big = media.png(400, 400, alpha=True) * 20
    result = ToolResult("files:", media=(
        ToolMedia(b"just some words", "image/png", "t-1"),
        ToolMedia(media.ZIP, "image/png", "t-2"),
        ToolMedia(b"", "image/png", "t-3"),
        ToolMedia(big, "image/png", "t-4"),
        ToolMedia(SMALL, "image/png", "t-5"),
        ToolMedia(SMALL, "image/png", "t-6"),
    ))
    kept = await keep.keep(result, "acme")
    assert kept.text.split("\n") == [
        "files:",
        "[attachment t-1 was not passed on: it is of type text/plain, which I can't read]",
        "[attachment t-2 was not passed on: it is of type application/zip, which I can't read]",
        "[attachment t-3 was not passed on: it is empty]",
        f"[attachment t-4 was not passed on: it is {human_size(len(big))}, over the 9.8 KB "
        "limit]",
        "[attachment t-6 was not passed on: only 5 attachments per message are read]",
    ]
    assert kept.attachments == (ref(SMALL, "t-5", "image/png"),)


async def test_a_store_fault_is_a_note_not_an_exception(tmp_path: Path) -> None:
    """A full disk refuses the file with a note; the text and the call go on."""
    keep = ToolMediaKeeper(FullBlobStore(tmp_path / "data"), limits=MediaLimits(),
                           images=IMAGE_LIMITS["anthropic"])
    kept = await keep.keep(ToolResult("", media=(ToolMedia(SMALL, "image/png", "s-1"),)), "t")
    assert (kept.text, kept.attachments, kept.media) == (
        "[attachment s-1 was not passed on: it could not be stored just now]", (), ())


class Camera:
    """A tool answering with an image, as an MCP tool does."""

    name = "cam__shot"
    description = "a picture"
    input_schema: Mapping[str, Any] = {"type": "object", "properties": {}}
    server = "cam"
    remote_name = "shot"

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        return ToolResult("[image: shot-1]", media=(ToolMedia(SMALL, "image/png", "shot-1"),))


async def test_the_registry_keeps_files_for_the_calls_tenant(tmp_path: Path) -> None:
    """Through the tool round the loop runs: the result block holds the text and the
    reference, the file is in the calling tenant's blobs; with no keeper, a note."""
    keep = keeper(tmp_path)
    registry = ToolRegistry([Camera()], keeper=keep)
    use = [{"type": "tool_use", "id": "u1", "name": "cam__shot", "input": {}}]
    message, meta = await run_tool_uses(registry.for_tenant("acme"), use, ACME, Metrics())
    assert message == {"role": "user", "content": [{
        "type": "tool_result", "tool_use_id": "u1",
        "content": [{"type": "text", "text": "[image: shot-1]"},
                    ref(SMALL, "shot-1", "image/png")]}]}
    assert meta["toolCalls"][0]["outcome"] == "ok"
    assert [b.hash for b in await keep.blobs.list_blobs("acme")] == [
        hashlib.sha256(SMALL).hexdigest()]
    bare = await ToolRegistry([Camera()]).run("cam__shot", {}, ACME)
    assert (bare.text, bare.attachments, bare.media) == (
        "[image: shot-1]\n[shot-1 was not passed on: files from tools are not kept here]",
        (), ())
