"""Attachments in the core, pure parts: sniffing, image fitting, refusals and their wording."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from gateway.media.images import IMAGE_LIMITS, ImageError, ImageLimits, fit
from gateway.media.policy import Refusal, clean_name, note_block, notice, too_large, unsupported
from gateway.media.sniff import sniff
from tests.fakes import media


@pytest.mark.parametrize(("data", "name", "expected"), [
    (media.jpeg(), "photo.png", "image/jpeg"),  # the name lies; the bytes do not
    (media.png(), "x", "image/png"),
    (media.PDF, "report.jpg", "application/pdf"),
    (media.OGG_VOICE, "voice.oga", "audio/ogg"),
    (media.MP4_VIDEO, "clip.mp4", "video/mp4"),
    (media.ZIP, "notes.txt", "application/zip"),
    (media.NOTES_MD, "notes.md", "text/markdown"),
    (b"a,b\n1,2\n", "table.csv", "text/csv"),
    (b"print('hi')\n", "run.py", "text/x-python"),
    (b"plain words\n", "README", "text/plain"),
    ("ünïcödé\ttabs\r\n".encode(), "a.weird-ext", "text/plain"),
    (b"\x00\x01\x02binary", "data.txt", None),
    (b"\xff\xfe\xfdnot utf-8", "x.txt", None),
])
def test_type_is_sniffed_from_the_bytes(data: bytes, name: str, expected: str | None) -> None:
    """Signatures win over names; text is UTF-8 without control bytes, subtyped by extension."""
    assert sniff(data, name) == expected


def test_image_within_limits_is_kept_byte_for_byte() -> None:
    """A small JPEG is stored exactly as sent by the person (no re-encoding)."""
    data = media.jpeg(100, 80)
    fitted = fit(data, "image/jpeg", IMAGE_LIMITS["anthropic"])
    assert (fitted.data, fitted.media_type, fitted.changed) == (data, "image/jpeg", False)


@pytest.mark.parametrize(("shape", "edge"), [("anthropic", 1568), ("openai", 2048)])
def test_large_photo_is_scaled_to_the_shapes_long_edge(shape: str, edge: int) -> None:
    """A 4000x3000 photo becomes a JPEG whose long edge is the provider's, aspect kept."""
    fitted = fit(media.jpeg(4000, 3000), "image/jpeg", IMAGE_LIMITS[shape])
    stored = Image.open(io.BytesIO(fitted.data))
    assert (stored.format, stored.size) == ("JPEG", (edge, edge * 3 // 4))
    assert (fitted.width, fitted.height, fitted.media_type, fitted.changed) == (
        edge, edge * 3 // 4, "image/jpeg", True)


def test_byte_limit_forces_recompression_then_smaller_edges() -> None:
    """An image within the edge but over the byte limit is re-encoded until it fits."""
    limits = ImageLimits(max_edge=1000, max_bytes=40_000)
    data = media.jpeg(900, 700, quality=100, noise=True)
    assert len(data) > limits.max_bytes
    fitted = fit(data, "image/jpeg", limits)
    assert len(fitted.data) <= limits.max_bytes
    assert fitted.changed
    assert max(fitted.width, fitted.height) <= 1000


def test_transparency_survives_as_png_and_exif_rotation_is_applied() -> None:
    """Alpha keeps PNG; a rotated phone photo is stored upright (EXIF applied on resize)."""
    fitted = fit(media.png(3000, 100, alpha=True), "image/png", IMAGE_LIMITS["anthropic"])
    assert fitted.media_type == "image/png"
    assert Image.open(io.BytesIO(fitted.data)).mode == "RGBA"
    rotated = media.with_exif_rotation(media.jpeg(2000, 1000))
    upright = fit(rotated, "image/jpeg", IMAGE_LIMITS["anthropic"])
    assert (upright.width, upright.height) == (784, 1568)  # portrait once turned


def test_unsupported_image_types_are_converted() -> None:
    """A BMP (neither provider takes it) is stored as a JPEG."""
    fitted = fit(media.bmp(), "image/bmp", IMAGE_LIMITS["openai"])
    assert (fitted.media_type, Image.open(io.BytesIO(fitted.data)).format) == (
        "image/jpeg", "JPEG")


def test_broken_and_huge_images_are_refused() -> None:
    """Truncated bytes and decompression bombs raise ImageError with a sentence to show."""
    with pytest.raises(ImageError, match="could not"):
        fit(media.jpeg(200, 200)[:40], "image/jpeg", IMAGE_LIMITS["anthropic"])
    with pytest.raises(ImageError, match="too many pixels"):
        fit(media.png(3000, 3000), "image/png", ImageLimits(1568, 10**7, max_pixels=1_000_000))


def encoded(fmt: str, mode: str, size: tuple[int, int], **options: object) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size).save(out, format=fmt, **options)
    return out.getvalue()


@pytest.mark.parametrize(("fmt", "mode", "largest", "options"), [
    ("PNG", "RGBA", (4096, 3072), {}),  # 4 bytes a pixel: 48 MiB
    ("GIF", "P", (4096, 6144), {}),  # a palette: 2 bytes a pixel
    ("WEBP", "RGB", (2048, 1536), {"lossless": True}),  # 16 bytes a pixel
])
def test_the_decode_budget_is_decided_from_the_header(
        fmt: str, mode: str, largest: tuple[int, int], options: dict[str, object]) -> None:
    """The largest image of its kind within the 48 MiB decode budget is fitted; one row
    more is refused from its header, with its size and the limit in megapixels."""
    width, height = largest
    fitted = fit(encoded(fmt, mode, (width, height), **options), f"image/{fmt.lower()}",
                 IMAGE_LIMITS["anthropic"])
    assert max(fitted.width, fitted.height) == 1568
    with pytest.raises(ImageError, match=rf"too large to decode safely \({width:,} x "
                                         rf"{height + 1:,} pixels; the limit for this kind"):
        fit(encoded(fmt, mode, (width, height + 1), **options), f"image/{fmt.lower()}",
            IMAGE_LIMITS["anthropic"])


def test_jpegs_are_decoded_scaled_and_progressive_ones_pay_for_their_coefficients() -> None:
    """A 59-megapixel baseline JPEG is decoded at a quarter of its size and fitted; the same
    picture saved progressive (its decoder holds every coefficient) is refused unread."""
    baseline = encoded("JPEG", "RGB", (7680, 7680), quality=50)
    assert fit(baseline, "image/jpeg", IMAGE_LIMITS["anthropic"]).width == 1568
    progressive = encoded("JPEG", "RGB", (7680, 7680), quality=50, progressive=True)
    with pytest.raises(ImageError, match="too large to decode safely"):
        fit(progressive, "image/jpeg", IMAGE_LIMITS["anthropic"])


def test_refusal_sentences() -> None:
    """Each refusal is one sentence saying what and why; several make one reply."""
    refusals = [
        too_large("big.zip", 52 * 1024 * 1024, 20 * 1024 * 1024),
        unsupported("a.zip", "application/zip"),
        Refusal("voice.ogg", "voice-disabled"),
        Refusal("clip.mp4", "video"),
        Refusal("z.png", "too-many", "10"),
    ]
    assert notice(refusals) == "\n".join([
        "I couldn't use big.zip: it is 52.0 MB, over the 20.0 MB limit.",
        "I couldn't use a.zip: it is of type application/zip, which I can't read.",
        "Voice messages are not enabled here, so I couldn't listen to voice.ogg.",
        "I couldn't use clip.mp4: videos are not supported here.",
        "I couldn't use z.png: only 10 attachments per message are read.",
    ])
    assert notice([]) is None
    assert note_block(refusals[3]) == {
        "type": "text",
        "text": "[attachment clip.mp4 was not passed on: videos are not supported here]"}


def test_file_names_are_cleaned() -> None:
    """No paths or control characters reach a message; empty names get the fallback."""
    assert clean_name("../../etc/passwd", "file") == "_.._etc_passwd"
    assert clean_name("a\x00b\nc.txt", "file") == "a_b_c.txt"
    assert clean_name("  ", "photo.jpg") == "photo.jpg"
    assert clean_name(None, "voice.ogg") == "voice.ogg"
    long = clean_name("x" * 300 + ".pdf", "file")
    assert len(long) <= 120
    assert long.endswith("….pdf")
