"""Images fitted to the provider's limits with Pillow, before they are stored (CPU-bound).

The bytes stored are exactly the bytes sent, so fitting happens once, when the image comes
in: an image within the limits (type, long edge, size) is kept byte for byte; one over them is
decoded, turned upright (EXIF orientation), scaled down to fit and encoded again: PNG when it
has transparency, else JPEG. Types the providers do not take (BMP, TIFF, ICO...) are converted
the same way.

Limits per request shape (:data:`IMAGE_LIMITS`):

* ``anthropic``: long edge 1568 px (the API scales larger images down to this before the model
  sees them, so more pixels only cost upload time) and 3.75 MiB (5 MiB once base64-encoded,
  the API's per-image limit);
* ``openai``: long edge 2048 px (the largest "high detail" size) and 20 MiB.

**Memory.** A small file can hold a huge image (a 170 KB PNG of 7,680 x 7,680 pixels decodes to
236 MB), so what a decode will cost is known before anything is decoded, from the header
(:func:`decode_cost`): the pixels decoded (a JPEG is decoded already scaled down, by Pillow's
``draft``, to the first size at or above the long edge wanted) times what each costs in its
format (4 bytes for RGB and RGBA, 2 for palette images, 1 for grey ones, 16 for WebP, whose
decoder keeps three canvases besides the image; a progressive JPEG also holds 2 bytes per DCT
coefficient of its full size, 3 a pixel for the usual 4:2:0). An image costing more than
:attr:`ImageLimits.max_decode_bytes` (48 MiB: 12.6 megapixels of RGB PNG, such as 4096 x 3072;
25 of GIF; 3.1 of WebP; a 12-megapixel progressive JPEG) is refused with one sentence, never
decoded; a
decoded image is first cut down by a whole factor (``reduce``, or nearest-neighbour for palette
images) so that every later step (rotation, conversion, resampling, encoding) works on a copy
of about the size sent. At most :data:`MAX_DECODES` decodes run at once in the process
(:func:`fit_async` runs them on a pool of that many threads; header checks and images kept as
they are do not wait for it), and the memory a decode took is given back to the system after
it (``malloc_trim``). The worst case is :data:`MAX_DECODES` x 48 MiB, plus the cut-down copies
(up to about half as much again): four 12.6-megapixel RGBA PNGs sent at once raised peak RSS by
195 MB; four 59-megapixel bombs (PNG, GIF, WebP: refused from the header; a JPEG: decoded at
a quarter of its size) by at most 80 MiB (``tests/e2e/test_image_memory.py``).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import io
import math
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sessions.attachments import IMAGE_TYPES

if TYPE_CHECKING:
    from PIL import Image

MIB: Final = 1024 * 1024
MAX_DECODES: Final = 2
"""Images decoded at the same time in this process (the rest wait their turn)."""
DECODE_BYTES: Final = 48 * MIB
"""The most one decode may cost (see the module docstring)."""
HEADER_PIXELS: Final = 60_000_000
"""Refused from the header whatever the format: past this even a scaled JPEG decode is slow."""


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """The largest image a provider is sent: long edge in pixels, encoded size in bytes; and
    what the gateway agrees to decode at all (decompression bombs): pixels in the header and
    the decode's memory (module docstring)."""

    max_edge: int
    max_bytes: int
    max_pixels: int = HEADER_PIXELS
    max_decode_bytes: int = DECODE_BYTES


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
_ONE_BYTE_MODES: Final = {"1": 1, "L": 1, "P": 2}
"""Bytes a pixel of these modes costs to decode (a palette image's decoder holds a second
byte a pixel: measured on GIF); every other mode is stored as 4."""
_COEFFICIENT_BYTES: Final = 6
"""A progressive JPEG's decoder holds every DCT coefficient: at most 3 components x 2 bytes a
pixel (unsubsampled; when its header does not say)."""
_WEBP_BYTES: Final = 16
"""Pillow's WebP decoder: its output, two canvases and the image, 4 bytes a pixel each."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _decoder_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_DECODES, thread_name_prefix="image-decode")
        return _pool


async def fit_async(data: bytes, media_type: str, limits: ImageLimits) -> FittedImage:
    """:func:`fit` off the event loop: the header is read in a worker thread, and a decode
    waits for one of the :data:`MAX_DECODES` decoder threads."""
    kept = await asyncio.to_thread(inspect, data, media_type, limits)
    if kept is not None:
        return kept
    return await asyncio.get_running_loop().run_in_executor(_decoder_pool(), _decode_fit,
                                                            data, limits)


def fit(data: bytes, media_type: str, limits: ImageLimits) -> FittedImage:
    """``data`` (sniffed as ``media_type``) within ``limits``; see the module docstring.
    Blocking and not limited in concurrency: async code calls :func:`fit_async`."""
    kept = inspect(data, media_type, limits)
    return kept if kept is not None else _decode_fit(data, limits)


def inspect(data: bytes, media_type: str, limits: ImageLimits) -> FittedImage | None:
    """From the header alone: ``data`` as it is when it fits, None when it is to be decoded
    and fitted (what that costs is within the limits); :class:`ImageError` when it cannot or
    must not be decoded."""
    image, (width, height) = _opened(data, limits)
    with image:
        if (media_type in IMAGE_TYPES and max(width, height) <= limits.max_edge
                and len(data) <= limits.max_bytes):
            return FittedImage(data, media_type, width, height, changed=False)
        cost = decode_cost(image, width, height)
    if cost > limits.max_decode_bytes:
        pixels = width * height * limits.max_decode_bytes / cost
        raise ImageError(
            f"it is too large to decode safely ({width:,} x {height:,} pixels; the limit for "
            f"this kind of image is {pixels / 1e6:.1f} megapixels)")
    return None


def _opened(data: bytes, limits: ImageLimits) -> tuple[Image.Image, tuple[int, int]]:
    """``data`` opened (the header read, nothing decoded), a JPEG set to decode scaled, and
    its full size (a drafted JPEG's ``size`` is the size it will decode at)."""
    # Imported with the first image, not with the gateway: Pillow is 2.4 MiB of resident
    # memory that a gateway nobody sends pictures to never needs.
    from PIL import Image, UnidentifiedImageError

    with warnings.catch_warnings():
        # Pillow warns (and past twice the limit raises) on huge pixel counts: both mean no.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise ImageError("it could not be opened as an image") from exc
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ImageError("it has too many pixels to open safely") from exc
    width, height = image.size
    if width * height > limits.max_pixels:
        image.close()
        raise ImageError("it has too many pixels to open safely")
    if image.format == "JPEG":
        # Let the JPEG decoder skip detail we would throw away (DCT scaling): it decodes at
        # 1/2, 1/4 or 1/8 of the size, the smallest still at or above the edge wanted.
        # (draft keeps both sides at or above the size asked: ask for the long edge's ratio.)
        long_edge = max(width, height, 1)
        image.draft("RGB", (math.ceil(width * limits.max_edge / long_edge),
                            math.ceil(height * limits.max_edge / long_edge)))
    return image, (width, height)


def decode_cost(image: Image.Image, width: int, height: int) -> int:
    """Bytes decoding ``image`` (opened, JPEGs drafted) will hold at once; ``width`` and
    ``height`` are its full size from the header (module docstring)."""
    decoded_width, decoded_height = image.size
    pixels = decoded_width * decoded_height
    if image.format == "WEBP":
        return pixels * _WEBP_BYTES
    cost = pixels * (_ONE_BYTE_MODES.get(image.mode, 4))
    if image.format == "JPEG" and (image.info.get("progressive")
                                   or image.info.get("progression")):
        cost += math.ceil(width * height * _coefficient_bytes(image))
    return cost


def _coefficient_bytes(image: Image.Image) -> float:
    """Bytes a progressive JPEG's decoder holds per pixel of its full size: 2 per DCT
    coefficient, a component subsampled by ``h x v`` having ``1/(h v)`` of them (4:2:0: 3)."""
    layers: list[tuple[int, int, int, int]] = getattr(image, "layer", None) or []
    if not layers:
        return _COEFFICIENT_BYTES
    h_max = max(h for _, h, _, _ in layers) or 1
    v_max = max(v for _, _, v, _ in layers) or 1
    return 2 * sum(h * v for _, h, v, _ in layers) / (h_max * v_max)


def _decode_fit(data: bytes, limits: ImageLimits) -> FittedImage:
    """Decode, cut down, fit (module docstring); the memory the decode took is given back
    before this returns."""
    try:
        return _fit_decoded(data, limits)
    except ImageError:
        raise
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError("it could not be decoded") from exc
    finally:
        _give_back()


def _fit_decoded(data: bytes, limits: ImageLimits) -> FittedImage:
    image, _ = _opened(data, limits)
    try:
        small = _reduced(image, limits.max_edge)
    except BaseException:
        image.close()
        raise
    if small is not image:
        image.close()  # the full-size pixels go now: later steps copy only the cut-down one
    del image  # (a WebP's decoder and its canvases go with the object)
    try:
        return _shrink_decoded(small, limits)
    finally:
        small.close()


def _give_back() -> None:
    """Return the decode's freed memory to the system. Pillow's blocks are freed into the
    decoder thread's malloc arena, which keeps them: four large decodes left 120 MB resident
    for good. ``malloc_trim`` (glibc) releases the free pages of every arena."""
    if _trim is not None:
        _trim(0)


def _load_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator gives memory back its own way
        return None
    return trim


_trim = _load_trim()


def _reduced(image: Image.Image, edge: int) -> Image.Image:
    """``image`` decoded, then cut down by the largest whole factor that keeps its long edge
    at or above ``edge`` (a new image; ``image`` itself when there is nothing to cut)."""
    from PIL import Image

    image.load()
    factor = max(image.size) // edge
    if factor < 2:
        return image
    if image.mode in ("1", "P"):  # reduce() does not take them; nearest keeps the palette
        width, height = image.size
        small = image.resize((max(1, width // factor), max(1, height // factor)),
                             Image.Resampling.NEAREST)
    else:
        small = image.reduce(factor)
    # Orientation and transparency survive the cut: the copy keeps the info and the EXIF.
    small.info = dict(image.info)
    exif = image.getexif()
    if exif:
        small.info["exif"] = exif.tobytes()
    return small


def _shrink_decoded(image: Image.Image, limits: ImageLimits) -> FittedImage:
    from PIL import Image, ImageOps

    ImageOps.exif_transpose(image, in_place=True)
    alpha = image.mode in ("RGBA", "LA", "PA") or (
        image.mode == "P" and "transparency" in image.info)
    mode = "RGBA" if alpha else "RGB"
    frame = image if image.mode == mode else image.convert(mode)
    edge = limits.max_edge
    for _ in range(8):  # each round shrinks the edge by a quarter; bounded however stubborn
        # Bicubic, Pillow's default for thumbnails: half the time of Lanczos, and the
        # difference does not survive the provider's own scaling.
        scale = min(1.0, edge / max(frame.size))
        size = (max(1, round(frame.width * scale)), max(1, round(frame.height * scale)))
        scaled = frame if size == frame.size else frame.resize(size,
                                                               Image.Resampling.BICUBIC)
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
