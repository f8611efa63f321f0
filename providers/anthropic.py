"""Anthropic Messages API provider, driven by the official ``anthropic`` SDK.

The body (prompt-cache breakpoints included) is shaped and encoded by :mod:`sessions.shapes`
and posted unchanged to ``/v1/messages`` through the client (see
:mod:`providers.sdk`), which also translates SDK exceptions into :mod:`gateway.edge.errors`
at the seam. ``temperature`` is refused at construction: the Messages API's request type (the
SDK's ``MessageCreateParams``) no longer has it, so every call would be rejected.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import anthropic

from gateway.edge.errors import ConfigError, ProviderError, ProviderStreamCut
from gateway.edge.provider import ProviderResponse, TextSink
from providers.common import parse_tool_input
from providers.sdk import (
    CHECK_TIMEOUT,
    Event,
    SdkErrors,
    SdkProvider,
    count,
    request_url,
    text_or_none,
    usage_of,
)
from providers.sse import END, SseReader, SseStream, loads
from sessions.endpoint import origin
from sessions.records import MessageDict
from sessions.shapes import Shape

API_PATH = "/v1/messages"


class AnthropicProvider(SdkProvider):
    """Claude through ``POST /v1/messages``; streams by default. An async context manager.

    ``timeout`` bounds the connect and every read, so a stalled stream fails with
    :class:`ProviderTimeout` while a steadily flowing one may run longer.
    """

    name = "anthropic"
    shape: Shape = "anthropic"
    errors: ClassVar[SdkErrors] = SdkErrors(
        anthropic.APIError, anthropic.APITimeoutError, anthropic.APIConnectionError,
        anthropic.APIStatusError, anthropic.RateLimitError,
    )

    def __init__(
        self,
        api_key: str,
        model: str,
        base_url: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        stream: bool = True,
        timeout: float = 60.0,
        max_retries: int = 2,
    ) -> None:
        params: dict[str, Any] = {"max_tokens": max_tokens}
        if stream:
            params["stream"] = True
        if temperature is not None:
            raise ConfigError("GATEWAY_TEMPERATURE: the Anthropic Messages API takes no "
                              "temperature (it is not in the SDK's request type); unset it")
        super().__init__(model, params)
        # The key lives only inside the client: nothing here can format it into a message.
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries,
            http_client=anthropic.DefaultAioHttpClient(),
        )
        self.endpoint = origin(str(self._client.base_url))
        self.url = request_url(self._client.base_url, API_PATH)
        """Where every call is posted: what the SDK itself would build from the base URL
        and :data:`API_PATH` (public, so a test holds the two side by side)."""

    async def _post(self, body: bytes, stream: bool) -> Any:
        return await self._client.post(
            self.url, content=body, cast_to=object, stream=stream,
            stream_cls=EventStream,
        )

    def _parse(self, answer: Event) -> ProviderResponse:
        content = answer.get("content")
        if not isinstance(content, list):
            raise ProviderError("anthropic: the answer has no content")
        stop = answer.get("stop_reason")
        return ProviderResponse(
            message={"role": "assistant", "content": [_block(b) for b in content]},
            stop_reason=stop if isinstance(stop, str) else None,
            usage=_usage(answer.get("usage")),
            response_id=text_or_none(answer.get("id")),
            response_model=text_or_none(answer.get("model")),
        )

    async def _assemble(
        self, events: AsyncIterator[Event], on_text: TextSink | None
    ) -> ProviderResponse:
        """Rebuild the whole assistant message from raw stream events."""
        blocks: dict[int, dict[str, Any]] = {}
        json_parts: dict[int, list[str]] = {}
        usage: dict[str, Any] = {}
        stop_reason: str | None = None
        response_id: str | None = None
        response_model: str | None = None
        finished = False
        async for event in events:
            kind = event.get("type")
            if kind == "content_block_delta":
                index = event.get("index")
                block = blocks.get(index) if isinstance(index, int) else None
                delta = event.get("delta")
                if block is None or not isinstance(index, int) or not isinstance(delta, dict):
                    raise ProviderError("anthropic: a delta for a block that never started")
                dtype = delta.get("type")
                if dtype == "text_delta":
                    text = str(delta.get("text", ""))
                    block["text"] = block.get("text", "") + text
                    if on_text is not None and text:
                        await on_text(text)
                elif dtype == "input_json_delta":
                    json_parts.setdefault(index, []).append(
                        str(delta.get("partial_json", "")))
                elif dtype == "thinking_delta":
                    block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
                elif dtype == "signature_delta":
                    block["signature"] = str(delta.get("signature", ""))
            elif kind == "content_block_start":
                index, opening = event.get("index"), event.get("content_block")
                if not isinstance(index, int) or not isinstance(opening, dict):
                    raise ProviderError("anthropic: a malformed content_block_start")
                blocks[index] = _block(opening)
            elif kind == "message_start":
                message = event.get("message")
                if isinstance(message, dict):
                    response_id = text_or_none(message.get("id"))
                    response_model = text_or_none(message.get("model"))
                    if isinstance(message.get("usage"), dict):
                        usage.update(message["usage"])
            elif kind == "message_delta":
                delta = event.get("delta")
                if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                    stop_reason = delta["stop_reason"]
                # Counts here are cumulative; a null one leaves message_start's standing.
                if isinstance(event.get("usage"), dict):
                    usage.update({k: v for k, v in event["usage"].items() if v is not None})
            elif kind == "message_stop":
                finished = True
        if not finished:
            # A clean end of the HTTP body without message_stop is still an incomplete answer.
            raise ProviderStreamCut("anthropic: the stream ended before message_stop")
        for index, parts in json_parts.items():
            blocks[index]["input"] = parse_tool_input("".join(parts))
        return ProviderResponse(
            message={"role": "assistant", "content": [blocks[i] for i in sorted(blocks)]},
            stop_reason=stop_reason,
            usage=_usage(usage),
            response_id=response_id,
            response_model=response_model,
        )

    async def _list_models(self) -> None:
        await self._client.with_options(max_retries=0, timeout=CHECK_TIMEOUT).models.list(limit=1)

    def _key(self) -> str | None:
        return self._client.api_key

    async def _close(self) -> None:
        await self._client.close()


class EventStream(SseStream[object], anthropic.AsyncStream[object]):
    """The SDK's ``AsyncStream`` read by :class:`~providers.sse.SseReader`: the same
    items, errors and observer calls as the SDK's own (``_streaming.py``), less CPU, nothing
    left open.

    Passed as ``stream_cls`` to the client's ``post``. Per event, as the SDK does: ``ping`` and
    events without a name are skipped; ``error`` raises the client's status error for the
    response (its body the event's JSON, or its text); an event without data is skipped;
    anything else is yielded as parsed (data that is not JSON raises ``json.JSONDecodeError``).
    Transport failures come out as httpx2 raised them, as from the SDK's stream.
    """

    def _watch(self) -> Any:
        # The SDK's tracing observer of this response, in the SDKs that have one.
        return getattr(self, "_observer", None)

    async def _item(self, reader: SseReader) -> Any:
        while True:
            sse = await reader.next()
            if sse is None:
                return END
            event, text = sse
            if event == "ping" or event is None:
                continue
            if event == "error":
                body: Any = text
                try:
                    body = loads(text)
                    message = f"{body}"
                except Exception:  # as the SDK: any failure to parse keeps the text
                    message = text or f"Error code: {self.response.status_code}"
                raise self._client._make_status_error(message, body=body, response=self.response)
            if not text:
                continue
            return self._client._process_response_data(
                data=loads(text), cast_to=self._cast_to, response=self.response)

    async def close(self) -> None:
        """Close the response (and the body's iterator); safe to call more than once."""
        if (observer := self._watch()) is not None:
            observer.end("closed")
        await super().close()


def _block(block: Any) -> MessageDict:
    """A response block in stored form: only the fields a later request sends back."""
    if not isinstance(block, dict):
        raise ProviderError("anthropic: a content block is not an object")
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.get("id"), "name": block.get("name"),
                "input": block.get("input") or {}}
    return {k: v for k, v in block.items() if v is not None}


def _usage(raw: Any) -> dict[str, int]:
    """Anthropic's counts are already the gateway's vocabulary: input excludes the cache."""
    if not isinstance(raw, dict):
        return {}
    return usage_of(
        input_tokens=count(raw.get("input_tokens")),
        output_tokens=count(raw.get("output_tokens")),
        cache_read=count(raw.get("cache_read_input_tokens")),
        cache_write=count(raw.get("cache_creation_input_tokens")),
    )
