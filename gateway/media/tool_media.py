"""Files a tool returned (an MCP server's screenshot, a chart, a PDF), stored like attachments.

A tool result may carry files for the model to see (:attr:`gateway.edge.tools.ToolResult.media`).
Before the result is recorded, :class:`ToolMediaKeeper` takes each one in the way the intake
takes a person's attachments (:mod:`gateway.media.intake`): the type is sniffed from the bytes,
an image over the provider's limits is scaled down (the stored bytes are exactly the bytes
sent), and the bytes go to the tenant's blob store once, by sha256. The result then holds
reference blocks beside its text (:func:`sessions.attachments.ref_block`), so the log never
holds the bytes and the request shapes expand them at send time and in replay: an image
block inside the Anthropic ``tool_result``; for OpenAI, whose tool messages take only text,
a user message right after the tool messages (:mod:`sessions.shapes`).

Only images and PDFs are taken: those are what both providers read as files. Anything else,
an empty or oversize file, one too many (``GATEWAY_MAX_ATTACHMENTS`` per result) or a store
fault becomes one line in the result's text saying what was not passed on and why, so the
model never answers as if it had seen it. Nothing here raises for bad input.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from gateway.edge.tools import ToolMedia, ToolResult
from gateway.media.images import ImageLimits
from gateway.media.intake import Examined, fit_image, store
from gateway.media.policy import MediaLimits, Refusal, note_block, too_large, unsupported
from gateway.media.sniff import sniff
from sessions.attachments import PDF, category
from sessions.blobs import BlobStore

log = logging.getLogger(__name__)


class ToolMediaKeeper:
    """Implements :class:`gateway.edge.tools.MediaKeeper` over a blob store (module docstring)."""

    def __init__(self, blobs: BlobStore, *, limits: MediaLimits, images: ImageLimits) -> None:
        self.blobs = blobs
        self.limits = limits
        self.images = images

    async def keep(self, result: ToolResult, tenant: str) -> ToolResult:
        refs: list[dict[str, Any]] = []
        notes: list[str] = []
        for position, medium in enumerate(result.media):
            if position >= self.limits.max_count:
                taken: dict[str, Any] | Refusal = Refusal(medium.name, "too-many",
                                                          str(self.limits.max_count))
            else:
                taken = await self._take(tenant, medium)
            if isinstance(taken, Refusal):
                log.info("a tool's file was not passed on (%s)", taken.reason)
                notes.append(note_block(taken)["text"])
            else:
                refs.append(taken)
        text = "\n".join([result.text, *notes] if result.text else notes)
        return dataclasses.replace(result, text=text, media=(),
                                   attachments=(*result.attachments, *refs))

    async def _take(self, tenant: str, medium: ToolMedia) -> dict[str, Any] | Refusal:
        if not medium.data:
            return Refusal(medium.name, "empty")
        if len(medium.data) > self.limits.max_bytes:
            return too_large(medium.name, len(medium.data), self.limits.max_bytes)
        examined = await self._examine(medium)
        if isinstance(examined, Refusal):
            return examined
        return await store(self.blobs, tenant, medium.name, examined)

    async def _examine(self, medium: ToolMedia) -> Examined | Refusal:
        """Sniff, then fit an image or keep a PDF (CPU work, in worker threads)."""
        media_type = await asyncio.to_thread(sniff, medium.data, medium.name)
        if media_type is not None and media_type.startswith("image/"):
            return await fit_image(medium.name, medium.data, media_type, self.images)
        if media_type is not None and category(media_type) == "pdf":
            return Examined(medium.data, PDF)
        return unsupported(medium.name, media_type)
