"""Which attachments the gateway takes, and what it says about the ones it refuses (pure).

A refused file never disappears silently: the person gets one clear reply listing what was
not used and why (:func:`notice`), and the model, when it is called, reads a short note in the
message where the file was (:func:`note_block`). Both are recorded with the message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from sessions.attachments import human_size

MIB: Final = 1024 * 1024
DEFAULT_MAX_BYTES: Final = 20 * MIB
"""Telegram's own download cap for bots; the same limit for every channel."""
DEFAULT_MAX_COUNT: Final = 10
MAX_TEXT_CHARS: Final = 200_000
"""A text file longer than this (about 50,000 tokens) is refused rather than read inline."""
MAX_NAME_CHARS: Final = 120

Reason = Literal[
    "too-large", "too-many", "empty", "unsupported-type", "video", "voice-disabled",
    "transcription-failed", "unreadable-image", "text-too-long", "download-failed",
    "not-stored", "unavailable",
]


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """``GATEWAY_MAX_ATTACHMENT_BYTES`` and ``GATEWAY_MAX_ATTACHMENTS``."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_count: int = DEFAULT_MAX_COUNT
    max_text_chars: int = MAX_TEXT_CHARS


@dataclass(frozen=True, slots=True)
class Refusal:
    """One file that was not used: its name, why, and the detail the sentence needs."""

    name: str
    reason: Reason
    detail: str = ""

    def sentence(self) -> str:
        """What the person is told, as one sentence."""
        if self.reason == "voice-disabled":
            return (f"Voice messages are not enabled here, so I couldn't listen to "
                    f"{self.name}.")
        return f"I couldn't use {self.name}: {self.because()}."

    def because(self) -> str:
        detail = self.detail
        return {
            "too-large": f"it is {detail}",
            "too-many": f"only {detail} attachments per message are read",
            "empty": "it is empty",
            "unsupported-type": f"it is {detail}, which I can't read",
            "video": "videos are not supported here",
            "voice-disabled": "voice messages are not enabled here",
            "transcription-failed": "it could not be transcribed just now",
            "unreadable-image": detail or "it could not be opened as an image",
            "text-too-long": f"it is too long to read ({detail})",
            "download-failed": "it could not be downloaded",
            "not-stored": "it could not be stored just now",
            "unavailable": "the platform did not make it available",
        }[self.reason]


def too_large(name: str, size: int | None, limit: int) -> Refusal:
    """``size`` None: not known (a download stopped at the limit)."""
    if size is None:
        return Refusal(name, "too-large", f"over the {human_size(limit)} limit")
    return Refusal(name, "too-large", f"{human_size(size)}, over the {human_size(limit)} limit")


def unsupported(name: str, media_type: str | None) -> Refusal:
    what = f"of type {media_type}" if media_type else "of a type I don't recognise"
    return Refusal(name, "unsupported-type", what)


def notice(refusals: list[Refusal]) -> str | None:
    """The one reply about refused files (one sentence each), or None when none were."""
    if not refusals:
        return None
    return "\n".join(r.sentence() for r in refusals)


def note_block(refusal: Refusal) -> dict[str, Any]:
    """What the model reads where a refused file was (so it does not answer as if it saw it)."""
    return {"type": "text",
            "text": f"[attachment {refusal.name} was not passed on: {refusal.because()}]"}


_UNSAFE_NAME: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029/\\]")


def clean_name(name: str | None, fallback: str) -> str:
    """A file name fit for messages and logs: no path, no control characters, bounded."""
    cleaned = _UNSAFE_NAME.sub("_", (name or "").strip()).strip(". ")
    if not cleaned:
        return fallback
    if len(cleaned) > MAX_NAME_CHARS:
        _stem, dot, ext = cleaned.rpartition(".")
        keep = ext if dot and len(ext) <= 10 else ""
        cleaned = cleaned[: MAX_NAME_CHARS - len(keep) - 2] + "…" + ("." + keep if keep else "")
    return cleaned
