"""OpenAI Chat Completions provider (and any compatible server), via the ``openai`` SDK.

The body comes from :func:`sessions.shapes.openai_body` and goes out unchanged: fields
``chat.completions.create`` knows are keyword arguments, anything else rides in
``extra_body``. Answers are converted back to stored Anthropic-style blocks, so the session log
and the agent loop see one message shape whichever API answered.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from types import TracebackType
from typing import Any, Self

import httpx2
import openai
from openai.resources.chat.completions import AsyncCompletions
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk

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
from sessions.shapes import Shape, openai_body

# Keyword arguments of chat.completions.create that are body fields.
_CREATE_FIELDS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {
    "self",
    "extra_headers",
    "extra_query",
    "extra_body",
    "timeout",
}
# OpenAI finish_reason -> the Anthropic stop_reason the rest of the gateway speaks.
_STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


class OpenAIProvider:
    """A Chat Completions model; streams by default. An async context manager.

    ``timeout`` bounds the connect and every read, so a stalled stream fails with
    :class:`ProviderTimeout` while a steadily flowing one may run longer.
    """

    name = "openai"
    shape: Shape = "openai"

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
            # Without include_usage a streamed answer carries no token counts at all.
            self._params["stream"] = True
            self._params["stream_options"] = {"include_usage": True}
        if temperature is not None:
            self._params["temperature"] = temperature
        # The key lives only inside the client: nothing here can format it into a message.
        self._client = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )
        self._closed = False

    def params(self) -> Mapping[str, Any]:
        """Body fields sent besides model/messages/tools (a fresh copy each call)."""
        return {k: dict(v) if isinstance(v, dict) else v for k, v in self._params.items()}

    async def complete(
        self, request: ProviderRequest, on_text: TextSink | None = None
    ) -> ProviderResponse:
        """Send one request; stream text deltas into ``on_text`` when ``stream`` is set."""
        body = openai_body(
            request.system, request.messages, request.tools, request.model, request.params
        )
        fields = {k: v for k, v in body.items() if k in _CREATE_FIELDS}
        extra = {k: v for k, v in body.items() if k not in _CREATE_FIELDS}
        try:
            result = await self._client.chat.completions.create(**fields, extra_body=extra or None)
        except openai.APIError as exc:
            raise _translate(exc, streaming=False) from exc
        if isinstance(result, ChatCompletion):
            return _from_completion(result)
        async with result, aclosing(_chunks(result)) as chunks:
            return await _assemble(chunks, on_text)

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


def _from_completion(completion: ChatCompletion) -> ProviderResponse:
    if not completion.choices:
        raise ProviderError("openai: the answer has no choices")
    choice = completion.choices[0]
    calls = [
        (call.id, call.function.name, call.function.arguments)
        for call in choice.message.tool_calls or []
        if call.type == "function"
    ]
    return ProviderResponse(
        message=_message(choice.message.content or "", calls),
        stop_reason=_stop_reason(choice.finish_reason),
        usage=_usage(completion.usage),
        response_id=completion.id or None,
        response_model=completion.model or None,
    )


async def _chunks(
    stream: openai.AsyncStream[ChatCompletionChunk],
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """The stream's chunks with transport failures translated; ``on_text``'s own are not."""
    try:
        async for chunk in stream:
            yield chunk
    except openai.APIError as exc:
        raise _translate(exc, streaming=True) from exc
    # Belt and braces: should a transport error escape the SDK's wrapping, it is still ours.
    except httpx2.TransportError as exc:
        raise stream_transport_error("openai", exc) from exc


async def _assemble(
    chunks: AsyncIterator[ChatCompletionChunk], on_text: TextSink | None
) -> ProviderResponse:
    """Rebuild the whole answer from chunks (choice 0; tool calls keyed by their index)."""
    text: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
    finish_reason: str | None = None
    usage: CompletionUsage | None = None
    response_id: str | None = None
    response_model: str | None = None
    async for chunk in chunks:
        response_id = response_id or chunk.id or None
        response_model = response_model or chunk.model or None
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.content:
            text.append(delta.content)
            if on_text is not None:
                await on_text(delta.content)
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, ["", "", ""])
            call[0] = part.id or call[0]
            if part.function is not None:
                call[1] += part.function.name or ""
                call[2] += part.function.arguments or ""
        if choice.finish_reason is not None:
            finish_reason = choice.finish_reason
    if finish_reason is None:
        # A clean end of the HTTP body without a finish_reason is still an incomplete answer.
        raise ProviderStreamCut("openai: the stream ended without a finish_reason")
    ordered = [(c[0], c[1], c[2]) for _, c in sorted(calls.items())]
    return ProviderResponse(
        message=_message("".join(text), ordered),
        stop_reason=_stop_reason(finish_reason),
        usage=_usage(usage),
        response_id=response_id,
        response_model=response_model,
    )


def _message(text: str, calls: list[tuple[str, str, str]]) -> MessageDict:
    """The answer as a stored assistant message with Anthropic-style blocks."""
    content: list[dict[str, Any]] = []
    # An empty text block only when there is nothing else, as the Messages API itself does.
    if text or not calls:
        content.append({"type": "text", "text": text})
    for call_id, name, arguments in calls:
        content.append(
            {"type": "tool_use", "id": call_id, "name": name, "input": parse_tool_input(arguments)}
        )
    return {"role": "assistant", "content": content}




def _stop_reason(finish_reason: str | None) -> str | None:
    if finish_reason is None:
        return None
    return _STOP_REASONS.get(finish_reason, finish_reason)


def _usage(usage: CompletionUsage | None) -> dict[str, int]:
    if usage is None:
        return {}
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def _translate(exc: openai.APIError, *, streaming: bool) -> ProviderError:
    """The gateway error for an SDK error. Messages carry status and ids, never the API text:
    OpenAI's 401 text quotes part of the key."""
    if isinstance(exc, openai.APITimeoutError):
        return ProviderTimeout("openai: no answer within the timeout")
    if isinstance(exc, openai.APIConnectionError):
        if streaming:
            return ProviderStreamCut("openai: the stream broke off")
        return ProviderUnavailable("openai: could not connect")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = f"openai: HTTP {status}"
        if exc.code or exc.type:
            message += f" {exc.code or exc.type}"
        if exc.request_id:
            message += f" (request id {exc.request_id})"
        if isinstance(exc, openai.RateLimitError):
            return ProviderRateLimited(message, status=status)
        if status >= 500:
            return ProviderUnavailable(message, status=status)
        return ProviderError(message, status=status)
    return ProviderError(f"openai: {type(exc).__name__}")
