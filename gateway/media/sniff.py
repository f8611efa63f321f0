"""What a file really is, from its bytes (pure): the sender's claimed type is never trusted.

Binary formats are recognised by their signatures (the ``filetype`` library: images, audio,
video, PDF, archives, office files...). A file with no known signature counts as text when it
is valid UTF-8 without control characters other than whitespace; its media type then comes
from the name's extension (``text/markdown``, ``text/csv``, ``text/x-python``...), defaulting
to ``text/plain``. Anything else is unknown (``None``).
"""

from __future__ import annotations

import mimetypes
import re
from typing import Final

import filetype

# Only the standard library's built-in table: the system's /etc/mime.types differs between
# machines, and the recorded media type must not.
_TYPES: Final = mimetypes.MimeTypes(filenames=())
for _ext in (".md", ".markdown"):  # common enough to name, missing from the built-in table
    _TYPES.add_type("text/markdown", _ext, strict=False)
# Control characters other than \t \n \v \f \r (and the BOM is fine): binary data, not text.
_BINARY: Final = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_SNIFF_BYTES: Final = 8192
"""Signatures sit in the first bytes; ``filetype`` reads at most this many."""
_ALIASES: Final = {
    "audio/x-wav": "audio/wav",
    "audio/x-flac": "audio/flac",
    "image/apng": "image/png",  # an animated PNG is a PNG to both providers
}


def sniff(data: bytes, name: str) -> str | None:
    """The media type of ``data`` judged from its content (``name`` only picks a text subtype),
    or ``None`` when it is neither a known binary format nor text."""
    guess = filetype.guess(data[:_SNIFF_BYTES])
    if guess is not None:
        mime = str(guess.mime)
        return _ALIASES.get(mime, mime)
    return text_type(data, name)


def text_type(data: bytes, name: str) -> str | None:
    """``text/...`` when ``data`` reads as UTF-8 text, else ``None``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if _BINARY.search(text):
        return None
    guessed, _ = _TYPES.guess_type(name, strict=False)
    return guessed if guessed is not None and guessed.startswith("text/") else "text/plain"
