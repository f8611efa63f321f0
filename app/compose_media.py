"""The composition root, media half: one set of limits for every file that comes in.

Attachments people send (the intake) and files tools return (the keeper) are taken in under
the same ``GATEWAY_MAX_ATTACHMENT*`` limits, fitted to the provider's request shape and kept
in the same blob store; building both here keeps them the same. Separate from
:mod:`app.compose_tools` and :mod:`app.compose_loop`, which both hand a keeper on.
"""

from __future__ import annotations

from app.config import Settings
from gateway.edge.provider import Provider
from gateway.media.images import IMAGE_LIMITS
from gateway.media.intake import FetchFile, MediaIntake
from gateway.media.policy import MediaLimits
from gateway.media.tool_media import ToolMediaKeeper
from gateway.media.transcribe import Transcriber
from sessions.blobs import BlobStore


def media_limits(settings: Settings) -> MediaLimits:
    return MediaLimits(max_bytes=settings.max_attachment_bytes,
                       max_count=settings.max_attachments)


def build_intake(settings: Settings, provider: Provider, blobs: BlobStore,
                 transcriber: Transcriber | None, fetch: FetchFile | None = None) -> MediaIntake:
    """Attachments are fitted to the limits of the provider's request shape; ``fetch``
    downloads the files a channel hands in as references (Slack's, Telegram's)."""
    return MediaIntake(blobs, limits=media_limits(settings), images=IMAGE_LIMITS[provider.shape],
                       transcriber=transcriber, fetch=fetch)


def build_keeper(settings: Settings, provider: Provider, blobs: BlobStore) -> ToolMediaKeeper:
    """Files tools return (MCP images) are taken in like attachments: same limits, same
    fitting to the provider's request shape, the same blob store."""
    return ToolMediaKeeper(blobs, limits=media_limits(settings),
                           images=IMAGE_LIMITS[provider.shape])
