"""Speech to text through the OpenAI audio transcription endpoint, via the ``openai`` SDK.

``POST {OPENAI_BASE_URL}/audio/transcriptions`` with the model ``GATEWAY_TRANSCRIPTION_MODEL``
(``whisper-1``, ``gpt-4o-mini-transcribe``...; any OpenAI-compatible server that offers the
endpoint works, a local one included). SDK errors are translated here, at the seam, into
:class:`gateway.edge.errors.TranscriptionError` carrying a short kind, never the audio or the text.
"""

from __future__ import annotations

import openai

from gateway.edge.errors import Failure, TranscriptionError


class OpenAITranscriber:
    """See :class:`gateway.media.transcribe.Transcriber`."""

    def __init__(self, *, api_key: str, model: str, base_url: str | None = None,
                 timeout: float = 60.0, max_retries: int = 2) -> None:
        self.model = model
        # The key lives only inside the client: nothing here can format it into a message.
        self._client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, timeout=timeout,
                                          max_retries=max_retries)
        self._closed = False

    async def transcribe(self, audio: bytes, media_type: str, name: str) -> str:
        try:
            result = await self._client.audio.transcriptions.create(
                model=self.model, file=(name, audio, media_type), response_format="json")
        except openai.APITimeoutError as exc:
            raise TranscriptionError("transcription timed out", kind=Failure.TIMEOUT) from exc
        except openai.APIConnectionError as exc:
            raise TranscriptionError("transcription server unreachable",
                                     kind=Failure.UNAVAILABLE) from exc
        except openai.APIStatusError as exc:
            raise TranscriptionError(f"transcription: HTTP {exc.status_code}",
                                     kind=f"http_{exc.status_code}") from exc
        except openai.APIError as exc:
            raise TranscriptionError("transcription failed", kind=type(exc).__name__) from exc
        return result.text.strip()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._client.close()
