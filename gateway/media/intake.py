"""Taking attachments in: check, sniff, fit, transcribe and store them before the message is
recorded.

The access gate hands every inbound message here first (the composition root puts the intake
between the gate and the router), so only people allowed to talk to the agent get files
stored. For each file, in order:

1. refused if the channel could not fetch it, if it is one too many (``max_count``), empty, or
   over ``max_bytes``;
2. its type is sniffed from the bytes (:mod:`gateway.media.sniff`), never taken from the claim;
3. images are fitted to the provider's limits (:mod:`gateway.media.images`), PDFs kept, text
   files checked for length, voice and audio transcribed (refused with one clear sentence when
   no transcriber is configured), anything else refused;
4. the bytes that will be sent are stored in the blob store under their sha256 and the message
   gets a reference block (:func:`sessions.attachments.ref_block`).

The result is the same inbound with ``attachments`` emptied and ``parts`` (reference blocks and
notes about refused files) and ``notice`` (the sentence for the person) set. A fault on one file
(a failed transcription, a blob store error, a failed download) refuses that file with a
notice; nothing here raises for bad input. CPU work (sniffing, Pillow) runs in a worker thread.

Files a channel fetches only after the acknowledgement (Slack's: its Events API wants an
answer within 3 seconds, and a download can take longer; Telegram's: a download would hold
every other chat's updates behind it) carry a ``ref``
(:func:`gateway.edge.messages.deferred`). :meth:`MediaIntake.wrap` lets such a message through
untouched, so it is owed with its references; the router calls :meth:`MediaIntake.prepare`
as its turn starts, which fetches each through ``fetch`` (the channel's
:meth:`~gateway.edge.channel.FetchChannel.fetch_file`, looked up by channel name).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.edge.channel import Deliver, ReplySink
from gateway.edge.errors import TranscriptionError
from gateway.edge.messages import Attachment, Inbound, deferred
from gateway.media.images import ImageError, ImageLimits, fit_async
from gateway.media.policy import (
    MediaLimits,
    Reason,
    Refusal,
    clean_name,
    note_block,
    notice,
    too_large,
    unsupported,
)
from gateway.media.sniff import sniff
from gateway.media.transcribe import Transcriber
from sessions.attachments import BlobRef, category, ref_block
from sessions.blobs import BlobStore
from sessions.errors import BlobWriteError

log = logging.getLogger(__name__)

_AUDIO_KINDS = frozenset({"voice", "audio", "video_note"})
_FALLBACK_NAMES = {"photo": "photo.jpg", "voice": "voice.ogg", "audio": "audio",
                   "video_note": "video-note.mp4", "sticker": "sticker.webp"}
_CHANNEL_PROBLEMS: dict[str, Reason] = {
    "download-failed": "download-failed", "unsupported": "video", "unavailable": "unavailable",
}


FetchFile = Callable[[str, Attachment], Awaitable[Attachment]]
"""Download a deferred attachment (one with a ``ref``) through the named channel."""


@dataclass(frozen=True, slots=True)
class Examined:
    """An attachment judged fit to store: the bytes to store and send, and what they are."""

    data: bytes
    media_type: str


class MediaIntake:
    """See the module docstring. One per gateway; holds no per-conversation state."""

    def __init__(self, blobs: BlobStore, *, limits: MediaLimits, images: ImageLimits,
                 transcriber: Transcriber | None, fetch: FetchFile | None = None) -> None:
        """``fetch``: how a deferred attachment is downloaded (without it, such a file is
        refused as not downloadable)."""
        self.blobs = blobs
        self.limits = limits
        self.images = images
        self.transcriber = transcriber
        self.fetch = fetch

    def wrap(self, deliver: Deliver) -> Deliver:
        """``deliver`` with the intake in front of it (what the access gate calls). A message
        with deferred files passes untouched: it is taken in as its turn starts."""

        async def deliver_prepared(inbound: Inbound, sink: ReplySink | None = None) -> object:
            if deferred(inbound):
                return await deliver(inbound, sink)
            return await deliver(await self.prepare(inbound), sink)

        return deliver_prepared

    async def prepare(self, inbound: Inbound) -> Inbound:
        """``inbound`` with its attachments taken in (see the module docstring)."""
        if not inbound.attachments:
            return inbound
        refs: list[dict[str, Any]] = []
        refusals: list[Refusal] = []
        for position, attachment in enumerate(inbound.attachments):
            name = clean_name(attachment.name, _FALLBACK_NAMES.get(attachment.kind, "file"))
            if position >= self.limits.max_count:
                refusals.append(Refusal(name, "too-many", str(self.limits.max_count)))
                continue
            if attachment.fetch is not None:  # downloaded only now, behind the access gate
                attachment = await attachment.fetch()
            elif attachment.ref is not None and attachment.problem is None:
                attachment = await self._fetch_deferred(inbound.key.channel, attachment)
            taken = await self._take(inbound.key.tenant, name, attachment)
            if isinstance(taken, Refusal):
                refusals.append(taken)
            else:
                refs.append(taken)
        for refusal in refusals:
            log.info("%s: refused an attachment (%s)", inbound.key.channel, refusal.reason)
        return dataclasses.replace(
            inbound, attachments=(),
            parts=(*refs, *(note_block(r) for r in refusals)),
            notice=notice(refusals),
        )

    async def _fetch_deferred(self, channel: str, attachment: Attachment) -> Attachment:
        """A deferred file downloaded through its channel; one that cannot be (no channel
        can fetch it, or fetching it failed) comes back with a ``problem``."""
        failed = dataclasses.replace(attachment, problem="download-failed")
        if self.fetch is None:
            log.warning("%s: no channel can fetch a deferred attachment", channel)
            return failed
        try:
            return await self.fetch(channel, attachment)
        except Exception:  # a fetcher's bug: the person is told, the turn goes on
            log.exception("%s: fetching a deferred attachment failed", channel)
            return failed

    async def _take(self, tenant: str, name: str,
                    attachment: Attachment) -> dict[str, Any] | Refusal:
        if attachment.problem is not None:
            if attachment.problem == "too-large":
                return too_large(name, attachment.size, self.limits.max_bytes)
            return Refusal(name, _CHANNEL_PROBLEMS.get(attachment.problem, "download-failed"))
        data = attachment.data
        if not data:
            return Refusal(name, "empty")
        if len(data) > self.limits.max_bytes:
            return too_large(name, len(data), self.limits.max_bytes)
        examined = await self._examine(name, attachment)
        if isinstance(examined, Refusal):
            return examined
        transcript: str | None = None
        if category(examined.media_type) == "audio":
            if self.transcriber is None:
                return Refusal(name, "voice-disabled")
            try:
                transcript = await self.transcriber.transcribe(examined.data,
                                                               examined.media_type, name)
            except TranscriptionError as exc:
                log.warning("transcription failed (%s)", exc.kind)
                return Refusal(name, "transcription-failed")
        return await store(self.blobs, tenant, name, examined, transcript=transcript)

    async def _examine(self, name: str, attachment: Attachment) -> Examined | Refusal:
        """Sniff, then fit or check by category (CPU work, in worker threads; images within
        the decode limits of :mod:`gateway.media.images`)."""
        data = attachment.data
        media_type = await asyncio.to_thread(sniff, data, name)
        if media_type is None:
            return unsupported(name, None)
        if media_type.startswith("video/") and attachment.kind not in _AUDIO_KINDS:
            return Refusal(name, "video")
        if media_type.startswith("image/"):
            return await fit_image(name, data, media_type, self.images)
        return await asyncio.to_thread(self._check, name, data, media_type)

    def _check(self, name: str, data: bytes, media_type: str) -> Examined | Refusal:
        """A file that is not an image, by category (a text file's length is counted)."""
        kind = category(media_type)
        if kind == "text":
            chars = len(data.decode("utf-8"))
            if chars > self.limits.max_text_chars:
                return Refusal(name, "text-too-long",
                               f"{chars:,} characters; the limit is "
                               f"{self.limits.max_text_chars:,}")
            return Examined(data, media_type)
        if kind in ("pdf", "audio"):
            return Examined(data, media_type)
        return unsupported(name, media_type)



async def fit_image(name: str, data: bytes, media_type: str,
                    images: ImageLimits) -> Examined | Refusal:
    """An image (sniffed as ``media_type``) fitted to ``images``, or why it cannot be used
    (in worker threads, decodes limited as :mod:`gateway.media.images` says)."""
    try:
        fitted = await fit_async(data, media_type, images)
    except ImageError as exc:
        return Refusal(name, "unreadable-image", str(exc))
    return Examined(fitted.data, fitted.media_type)


async def store(blobs: BlobStore, tenant: str, name: str, examined: Examined, *,
                transcript: str | None = None) -> dict[str, Any] | Refusal:
    """Store ``examined`` in ``tenant``'s blobs: the reference block, or a refusal when the
    store failed (logged once, by kind)."""
    try:
        digest = await blobs.put(tenant, examined.data)
    except BlobWriteError as exc:
        log.warning("storing an attachment failed (%s)", exc.kind)
        return Refusal(name, "not-stored")
    ref = BlobRef(digest, name, examined.media_type, len(examined.data))
    return ref_block(ref, transcript=transcript)
