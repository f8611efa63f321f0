"""Anthropic Messages API provider, driven by the official ``anthropic`` SDK.

The body comes from :func:`sessions.shapes.anthropic_body` and goes out unchanged: the fields
``messages.create`` knows are passed as keyword arguments and the rest (``temperature`` is no
longer in its signature) as ``extra_body``, which the SDK merges into the JSON as given. SDK
exceptions are translated into :mod:`gateway.errors` here, at the seam.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from types import TracebackType
from typing import Any, Self

import anthropic
import httpx2
from anthropic.resources.messages import AsyncMessages
from anthropic.types import ContentBlock, Message, RawMessageStreamEvent

from gateway.errors import (
    ProviderError,
    ProviderRateLimited,
    ProviderStreamCut,
    ProviderTimeout,
    ProviderUnavailable,
)
from gateway.providers.base import ProviderRequest, ProviderResponse, TextSink
from gateway.providers.common import parse_tool_input, stream_transport_error
from sessions.records import MessageDict
from sessions.shapes import Shape, anthropic_body

# Keyword arguments of messages.create that are body fields (the rest configure the request).
_CREATE_FIELDS = frozenset(inspect.signature(AsyncMessages.create).parameters) - {
    "self",
    "extra_headers",
    "extra_query",
    "extra_body",
    "timeout",
}
_UNAVAILABLE_TYPES = frozenset({"overloaded_error", "api_error"})


class AnthropicProvider:
    """Claude through ``POST /v1/messages``; streams by default. An async context manager.

    ``timeout`` bounds the connect and every read, so a stalled stream fails with
    :class:`ProviderTimeout` while a steadily flowing one may run longer.
    """

    name = "anthropic"
    shape: Shape = "anthropic"

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
        self.model = model
        self._params: dict[str, Any] = {"max_tokens": max_tokens}
        if stream:
            self._params["stream"] = True
        if temperature is not None:
            self._params["temperature"] = temperature
        # The key lives only inside the client: nothing here can format it into a message.
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )
        self._closed = False

    def params(self) -> Mapping[str, Any]:
        """Body fields sent besides model/system/messages/tools (a fresh copy each call)."""
        return dict(self._params)

    async def complete(
        self, request: ProviderRequest, on_text: TextSink | None = None
    ) -> ProviderResponse:
        """Send one request; stream text deltas into ``on_text`` when ``stream`` is set."""
        body = anthropic_body(
            request.system, request.messages, request.tools, request.model, request.params
        )
        fields = {k: v for k, v in body.items() if k in _CREATE_FIELDS}
        extra = {k: v for k, v in body.items() if k not in _CREATE_FIELDS}
        try:
            result = await self._client.messages.create(**fields, extra_body=extra or None)
        except anthropic.APIError as exc:
            raise _translate(exc, streaming=False) from exc
        if isinstance(result, Message):
            return ProviderResponse(
                message={"role": "assistant", "content": [_block(b) for b in result.content]},
                stop_reason=result.stop_reason,
                usage={
                    "input_tokens": result.usage.input_tokens,
                    "output_tokens": result.usage.output_tokens,
                },
                response_id=result.id or None,
                response_model=result.model or None,
            )
        async with result, aclosing(_events(result)) as events:
            return await _assemble(events, on_text)

    async def aclose(self) -> None:
        """Close the HTTP client; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _events(
    stream: anthropic.AsyncStream[RawMessageStreamEvent],
) -> AsyncGenerator[RawMessageStreamEvent, None]:
    """The stream's events with transport failures translated; ``on_text``'s own are not."""
    try:
        async for event in stream:
            yield event
    except anthropic.APIError as exc:
        raise _translate(exc, streaming=True) from exc
    # The SDK lets the transport's errors escape from stream iteration unwrapped.
    except httpx2.TransportError as exc:
        raise stream_transport_error("anthropic", exc) from exc


async def _assemble(
    events: AsyncIterator[RawMessageStreamEvent], on_text: TextSink | None
) -> ProviderResponse:
    """Rebuild the whole assistant message from raw stream events."""
    blocks: dict[int, dict[str, Any]] = {}
    json_parts: dict[int, list[str]] = {}
    usage: dict[str, int] = {}
    stop_reason: str | None = None
    response_id: str | None = None
    response_model: str | None = None
    finished = False
    async for event in events:
        if event.type == "message_start":
            response_id = event.message.id or None
            response_model = event.message.model or None
            usage["input_tokens"] = event.message.usage.input_tokens
            usage["output_tokens"] = event.message.usage.output_tokens
        elif event.type == "content_block_start":
            blocks[event.index] = _block(event.content_block)
        elif event.type == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                blocks[event.index]["text"] += delta.text
                if on_text is not None and delta.text:
                    await on_text(delta.text)
            elif delta.type == "input_json_delta":
                json_parts.setdefault(event.index, []).append(delta.partial_json)
        elif event.type == "message_delta":
            stop_reason = event.delta.stop_reason
            usage["output_tokens"] = event.usage.output_tokens
            if event.usage.input_tokens is not None:
                usage["input_tokens"] = event.usage.input_tokens
        elif event.type == "message_stop":
            finished = True
    if not finished:
        # A clean end of the HTTP body without message_stop is still an incomplete answer.
        raise ProviderStreamCut("anthropic: the stream ended before message_stop")
    for index, parts in json_parts.items():
        blocks[index]["input"] = parse_tool_input("".join(parts))
    return ProviderResponse(
        message={"role": "assistant", "content": [blocks[i] for i in sorted(blocks)]},
        stop_reason=stop_reason,
        usage=usage,
        response_id=response_id,
        response_model=response_model,
    )


def _block(block: ContentBlock) -> MessageDict:
    """A response block in stored form: only the fields a later request sends back."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return block.model_dump(mode="json", exclude_none=True)




def _translate(exc: anthropic.APIError, *, streaming: bool) -> ProviderError:
    """The gateway error for an SDK error. Messages carry status and ids, never the API text,
    which for some auth errors echoes part of the key."""
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderTimeout("anthropic: no answer within the timeout")
    if isinstance(exc, anthropic.APIConnectionError):
        if streaming:
            return ProviderStreamCut("anthropic: the stream broke off")
        return ProviderUnavailable("anthropic: could not connect")
    if isinstance(exc, anthropic.APIStatusError):
        status, kind = exc.status_code, exc.type
        message = f"anthropic: HTTP {status}"
        if kind:
            message += f" {kind}"
        if exc.request_id:
            message += f" (request id {exc.request_id})"
        # Errors sent inside a 200 stream (event: error) only say what they are in `type`.
        if isinstance(exc, anthropic.RateLimitError) or kind == "rate_limit_error":
            return ProviderRateLimited(message, status=status)
        if status >= 500 or kind in _UNAVAILABLE_TYPES:
            return ProviderUnavailable(message, status=status)
        return ProviderError(message, status=status)
    return ProviderError(f"anthropic: {type(exc).__name__}")
