"""Sample attachment bytes for tests and benchmarks: real image encodings (Pillow), and the
signatures other formats are recognised by. Deterministic: the same call gives the same bytes."""

from __future__ import annotations

import io
import random

from PIL import Image


def jpeg(width: int = 64, height: int = 48, *, quality: int = 90, noise: bool = False,
         seed: int = 7) -> bytes:
    """A JPEG photo; ``noise`` makes it hard to compress (a realistic size for its pixels)."""
    if noise:
        rng = random.Random(seed)
        image = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    else:
        image = Image.new("RGB", (width, height))
        for x in range(0, width, max(1, width // 8)):
            for y in range(0, height, max(1, height // 8)):
                image.putpixel((x, y), ((x * 7) % 256, (y * 5) % 256, 128))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def png(width: int = 32, height: int = 32, *, alpha: bool = False) -> bytes:
    image = Image.new("RGBA" if alpha else "RGB", (width, height),
                      (10, 200, 30, 120) if alpha else (10, 200, 30))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def bmp(width: int = 16, height: int = 16) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (255, 0, 0)).save(out, format="BMP")
    return out.getvalue()


def with_exif_rotation(data: bytes) -> bytes:
    """``data`` (a JPEG) re-saved with EXIF orientation 6 (shown rotated 90° clockwise)."""
    image = Image.open(io.BytesIO(data))
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif)
    return out.getvalue()


PDF = (b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
       b"2 0 obj << /Type /Pages /Kids [] /Count 0 >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n")
OGG_VOICE = b"OggS\x00\x02" + b"\x00" * 22 + b"\x01\x13OpusHead" + bytes(range(64)) * 4
MP4_VIDEO = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + b"\x00" * 200
ZIP = b"PK\x03\x04" + b"\x14\x00" * 20
NOTES_MD = b"# Shopping\n- green tea\n- oat milk\n"
