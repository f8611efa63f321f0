"""The transcription seam: voice notes and audio files to text, before the model sees them.

Chosen by the composition root: the OpenAI audio transcription endpoint when
``GATEWAY_TRANSCRIPTION_MODEL`` names a model (any OpenAI-compatible server, through
``OPENAI_BASE_URL``), a deterministic fake with the offline provider, or none (voice is then
refused with one clear sentence).
"""

from __future__ import annotations

from typing import Protocol


class Transcriber(Protocol):
    """Speech to text.

    Contract: :meth:`transcribe` returns the text heard in ``audio`` (sniffed as
    ``media_type``; ``name`` is its file name, for servers that want one), or raises
    :class:`gateway.edge.errors.TranscriptionError` after its own retries, never hanging past its
    timeout. ``model`` is what the transcript is recorded as coming from. :meth:`aclose` is
    idempotent.
    """

    model: str

    async def transcribe(self, audio: bytes, media_type: str, name: str) -> str: ...

    async def aclose(self) -> None: ...
