"""Images fitted to the provider's limits with Pillow, before they are stored (pure, CPU-bound).

The bytes stored are exactly the bytes sent, so fitting happens once, when the image comes
in: an image within the limits (type, long edge, size) is kept byte for byte; one over them is
decoded, turned upright (EXIF orientation), scaled down to fit and encoded again: PNG when it
has transparency, else JPEG. Types the providers do not take (BMP, TIFF, ICO...) are converted
the same way. The work is CPU-bound; callers run it in a worker thread.

Limits per request shape (:data:`IMAGE_LIMITS`):

* ``anthropic``: long edge 1568 px (the API scales larger images down to this before the model
  sees them, so more pixels only cost upload time) and 3.75 MiB (5 MiB once base64-encoded,
  the API's per-image limit);
* ``openai``: long edge 2048 px (the largest "high detail" size) and 20 MiB.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sessions.attachments import IMAGE_TYPES

if TYPE_CHECKING:
    from PIL import Image

MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """The largest image a provider is sent: long edge in pixels, encoded size in bytes,
    and the most pixels the gateway agrees to decode at all (decompression bombs)."""

    max_edge: int
    max_bytes: int
    max_pixels: int = 60_000_000


IMAGE_LIMITS: Final = {
    "anthropic": ImageLimits(max_edge=1568, max_bytes=5 * MIB * 3 // 4),
    "openai": ImageLimits(max_edge=2048, max_bytes=20 * MIB),
}


@dataclass(frozen=True, slots=True)
class FittedImage:
    """The bytes to store (and send) and what they are."""

    data: bytes
    media_type: str
    width: int
    height: int
    changed: bool


class ImageError(ValueError):
    """The bytes could not be used as an image; the message is short and safe to show."""


_QUALITIES: Final = (85, 70, 55)


def fit(data: bytes, media_type: str, limits: ImageLimits) -> FittedImage:
    """``data`` (sniffed as ``media_type``) within ``limits``; see the module docstring."""
    # Imported with the first image, not with the gateway: Pillow is 2.4 MiB of resident
    # memory that a gateway nobody sends pictures to never needs.
    from PIL import Image, UnidentifiedImageError

    with warnings.catch_warnings():
        # Pillow warns (and past twice the limit raises) on huge pixel counts: both mean no.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
            width, height = image.size
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise ImageError("it could not be opened as an image") from exc
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ImageError("it has too many pixels to open safely") from exc
        if width * height > limits.max_pixels:
            raise ImageError("it has too many pixels to open safely")
        if (media_type in IMAGE_TYPES and max(width, height) <= limits.max_edge
                and len(data) <= limits.max_bytes):
            return FittedImage(data, media_type, width, height, changed=False)
        try:
            return _shrink(image, limits)
        except (OSError, SyntaxError, ValueError) as exc:
            raise ImageError("it could not be decoded") from exc


def _shrink(image: Image.Image, limits: ImageLimits) -> FittedImage:
    from PIL import Image, ImageOps

    edge = limits.max_edge
    if image.format == "JPEG":
        # Let the JPEG decoder skip detail we would throw away (DCT scaling): much faster.
        image.draft("RGB", (edge, edge))
    frame = ImageOps.exif_transpose(image) or image  # (older Pillow types it Optional)
    alpha = frame.mode in ("RGBA", "LA", "PA") or (
        frame.mode == "P" and "transparency" in frame.info)
    frame = frame.convert("RGBA" if alpha else "RGB")
    for _ in range(8):  # each round shrinks the edge by a quarter; bounded however stubborn
        scaled = frame.copy()
        # Bicubic, Pillow's default for thumbnails: half the time of Lanczos, and the
        # difference does not survive the provider's own scaling.
        scaled.thumbnail((edge, edge), Image.Resampling.BICUBIC)
        for quality in (None,) if alpha else _QUALITIES:
            encoded = _encode(scaled, alpha, quality)
            if len(encoded) <= limits.max_bytes:
                return FittedImage(encoded, "image/png" if alpha else "image/jpeg",
                                   scaled.width, scaled.height, changed=True)
        edge = max(1, edge * 3 // 4)
    raise ImageError("it could not be made small enough")


def _encode(image: Image.Image, alpha: bool, quality: int | None) -> bytes:
    out = io.BytesIO()
    if alpha:
        image.save(out, format="PNG")
    else:
        image.save(out, format="JPEG", quality=quality)  # optimize=True: 2x the time, 4 % smaller
    return out.getvalue()
