"""OpenAI Chat Completions provider (and any compatible server), via the ``openai`` SDK.

The body is shaped and encoded by :mod:`sessions.shapes` and posted unchanged to
``/chat/completions`` through the client (see :mod:`providers.sdk`). Answers are
converted back to stored Anthropic-style blocks, so the session log and the agent loop see one
message shape whichever API answered.

Parameters follow what current models expect: the answer's length limit goes out as
``max_completion_tokens`` (OpenAI refuses ``max_tokens`` for its reasoning models and has
deprecated it for the rest; an older compatible server may need ``max_tokens``, a setting), and
``reasoning_effort`` is sent only to models that reason, which also refuse a ``temperature``.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar, Literal

import httpx2
import openai

from gateway.edge.errors import ProviderError, ProviderStreamCut
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

log = logging.getLogger(__name__)

MaxTokensField = Literal["max_completion_tokens", "max_tokens"]
API_PATH = "/chat/completions"
# OpenAI finish_reason -> the Anthropic stop_reason the rest of the gateway speaks.
_STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}
_REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")
_NOT_REASONING = ("gpt-5-chat",)


def has_reasoning(model: str) -> bool:
    """Whether ``model`` is one of OpenAI's reasoning models (o-series, GPT-5 family; not the
    GPT-5 chat variants): those take ``reasoning_effort`` and refuse ``temperature``."""
    name = model.rsplit("/", 1)[-1].lower()
    return name.startswith(_REASONING_PREFIXES) and not name.startswith(_NOT_REASONING)


class OpenAIProvider(SdkProvider):
    """A Chat Completions model; streams by default. An async context manager.

    ``timeout`` bounds the connect and every read, so a stalled stream fails with
    :class:`ProviderTimeout` while a steadily flowing one may run longer.
    """

    name = "openai"
    shape: Shape = "openai"
    errors: ClassVar[SdkErrors] = SdkErrors(
        openai.APIError, openai.APITimeoutError, openai.APIConnectionError, openai.APIStatusError,
        openai.RateLimitError,
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
        max_tokens_field: MaxTokensField = "max_completion_tokens",
        reasoning_effort: str | None = None,
    ) -> None:
        params: dict[str, Any] = {max_tokens_field: max_tokens}
        reasoning = has_reasoning(model)
        if reasoning_effort is not None:
            if reasoning:
                params["reasoning_effort"] = reasoning_effort
            else:
                log.warning("model %s does not reason: reasoning_effort is not sent", model)
        if stream:
            # Without include_usage a streamed answer carries no token counts at all.
            params["stream"] = True
            params["stream_options"] = {"include_usage": True}
        if temperature is not None:
            if reasoning:
                log.warning("model %s refuses a temperature: it is not sent", model)
            else:
                params["temperature"] = temperature
        super().__init__(model, params)
        # The key lives only inside the client: nothing here can format it into a message.
        self._client = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries,
            http_client=openai.DefaultAioHttpClient(),
        )
        self.endpoint = origin(str(self._client.base_url))
        self.url = request_url(self._client.base_url, API_PATH)
        """Where every call is posted: what the SDK itself would build from the base URL
        and :data:`API_PATH` (public, so a test holds the two side by side)."""

    async def _post(self, body: bytes, stream: bool) -> Any:
        return await self._client.post(
            self.url, content=body, cast_to=object, stream=stream,
            stream_cls=ChunkStream,
            # As chat.completions.create asks: the API key as a bearer token.
            options={"security": {"bearer_auth": True}},
        )

    def _parse(self, answer: Event) -> ProviderResponse:
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ProviderError("openai: the answer has no choices")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ProviderError("openai: the answer's choice has no message")
        calls = [
            (str(call.get("id", "")), str(function.get("name", "")),
             str(function.get("arguments") or ""))
            for call in message.get("tool_calls") or []
            if isinstance(call, dict) and call.get("type") == "function"
            and isinstance(function := call.get("function"), dict)
        ]
        return ProviderResponse(
            message=_message(str(message.get("content") or ""), calls),
            stop_reason=_stop_reason(choice.get("finish_reason")),
            usage=_usage(answer.get("usage")),
            response_id=text_or_none(answer.get("id")),
            response_model=text_or_none(answer.get("model")),
        )

    async def _assemble(
        self, events: AsyncIterator[Event], on_text: TextSink | None
    ) -> ProviderResponse:
        """Rebuild the whole answer from chunks (choice 0; tool calls keyed by their index)."""
        text: list[str] = []
        calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        finish_reason: str | None = None
        usage: Any = None
        response_id: str | None = None
        response_model: str | None = None
        async for chunk in events:
            response_id = response_id or text_or_none(chunk.get("id"))
            response_model = response_model or text_or_none(chunk.get("model"))
            if chunk.get("usage") is not None:
                usage = chunk["usage"]
            choices = chunk.get("choices")
            if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
                continue
            choice = choices[0]
            delta = choice.get("delta")
            if isinstance(delta, dict):
                content = delta.get("content")
                if content and isinstance(content, str):
                    text.append(content)
                    if on_text is not None:
                        await on_text(content)
                for part in delta.get("tool_calls") or []:
                    if not isinstance(part, dict) or not isinstance(part.get("index"), int):
                        raise ProviderError("openai: a malformed tool call delta")
                    call = calls.setdefault(part["index"], ["", "", ""])
                    call[0] = str(part.get("id") or call[0])
                    function = part.get("function")
                    if isinstance(function, dict):
                        call[1] += str(function.get("name") or "")
                        call[2] += str(function.get("arguments") or "")
            if isinstance(choice.get("finish_reason"), str):
                finish_reason = choice["finish_reason"]
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

    async def _list_models(self) -> None:
        await self._client.with_options(max_retries=0, timeout=CHECK_TIMEOUT).models.list()

    def _key(self) -> str | None:
        return self._client.api_key

    async def _close(self) -> None:
        await self._client.close()


class ChunkStream(SseStream[object], openai.AsyncStream[object]):
    """The SDK's ``AsyncStream`` read by :class:`~providers.sse.SseReader`: the same
    items and errors as the SDK's own (``_streaming.py``), less CPU, nothing left open.

    Passed as ``stream_cls`` to the client's ``post``. Per event, as the SDK does: ``[DONE]``
    ends the answer (the rest of an HTTP/1.1 body is read for at most 0.1 s, so the connection
    can be reused); a ``thread.*`` event yields ``{"data": ..., "event": ...}``; data that is an
    object with a truthy ``error`` raises ``openai.APIError``; anything else is yielded as
    parsed. A read that times out raises ``APITimeoutError``, any other transport failure
    ``APIConnectionError``; data that is not JSON raises ``json.JSONDecodeError``.
    """

    async def _item(self, reader: SseReader) -> Any:
        response = self.response
        options = self._options
        # Both options are newer than the oldest SDK the gateway allows: absent, the defaults.
        legacy = getattr(options, "stream_mode", "legacy") == "legacy"
        while True:
            try:
                sse = await reader.next()
            except httpx2.TimeoutException as err:
                raise openai.APITimeoutError(request=response.request) from err
            except (httpx2.RequestError, ssl.SSLError) as err:
                raise openai.APIConnectionError(request=response.request) from err
            if sse is None:
                return END
            event, text = sse
            if text.startswith("[DONE]"):
                if response.http_version == "HTTP/1.1":
                    await reader.drain()
                return END
            data = loads(text)
            if legacy and event and event.startswith("thread."):
                data = {"data": data, "event": event}
            else:
                if legacy and isinstance(data, Mapping) and data.get("error"):
                    error = data.get("error")
                    message = error.get("message") if isinstance(error, Mapping) else None
                    if not message or not isinstance(message, str):
                        message = "An error occurred during streaming"
                    raise openai.APIError(message=message, request=response.request,
                                          body=data["error"])
                if getattr(options, "synthesize_event_and_data", None):
                    data = {"data": data, "event": event}
            return self._client._process_response_data(
                data=data, cast_to=self._cast_to, response=response)


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


def _stop_reason(finish_reason: Any) -> str | None:
    if not isinstance(finish_reason, str):
        return None
    return _STOP_REASONS.get(finish_reason, finish_reason)


def _usage(raw: Any) -> dict[str, int]:
    """OpenAI counts cached tokens inside ``prompt_tokens``; the gateway's ``input_tokens``
    leaves them out (as Anthropic's does), so prices apply the same way to both."""
    if not isinstance(raw, dict):
        return {}
    prompt = count(raw.get("prompt_tokens"))
    details = raw.get("prompt_tokens_details")
    cached = min(count(details.get("cached_tokens")), prompt) if isinstance(details, dict) else 0
    done = raw.get("completion_tokens_details")
    reasoning = count(done.get("reasoning_tokens")) if isinstance(done, dict) else 0
    return usage_of(input_tokens=prompt - cached, output_tokens=count(raw.get("completion_tokens")),
                    cache_read=cached, reasoning=reasoning)
