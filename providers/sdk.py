"""The skeleton both SDK providers share: post the recorded bytes through the official client.

A call's body is built by :func:`sessions.shapes.request_body` and encoded by
:func:`sessions.shapes.encode_body`, the same two functions replay uses, and those bytes go out
through the SDK client's low-level ``post``. The client still does what it is there for (auth
headers, retries with backoff, typed status errors, timeouts); what it no longer
does is re-walk every message of every request against its request TypedDicts
(``_transform.py``), which cost more CPU than the rest of a turn, and it never gets the chance
to send anything but what was recorded. Answers come back as plain JSON (``cast_to=object``),
not validated into pydantic models per stream event: the subclasses read the few fields they
need and treat anything else as a malformed answer.

A streamed answer is read by a subclass of the SDK's own ``AsyncStream`` that each provider
passes as ``stream_cls`` (:mod:`providers.sse`): the same items and errors as the
SDK's, decoded in blocks rather than line by line through five nested generators, and with
every iterator closed (the OpenAI SDK's left three per call for asyncio to finalise).

Both clients use the SDKs' own aiohttp transport (``DefaultAioHttpClient``, their documented
``http_client``): the gateway already runs on aiohttp, and per call it costs about a third
less CPU than the default httpx2/h11 stack (``bench/bench_provider.py``).

Subclasses (:mod:`providers.anthropic`, :mod:`providers.openai`) supply the
client call, the answer parsing and their SDK's exception classes (:class:`SdkErrors`); the
translation into :mod:`gateway.edge.errors` is one, here, because both SDKs raise the same tree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Self

import httpx2

from gateway.edge.errors import (
    ProviderError,
    ProviderRateLimited,
    ProviderStreamCut,
    ProviderTimeout,
    ProviderUnavailable,
)
from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from providers.check import check_error
from providers.common import stream_transport_error
from sessions.shapes import Shape, encode_body, request_body

Event = dict[str, Any]
"""One decoded stream event (Anthropic) or chunk (OpenAI), as the JSON the API sent."""

# Error types that mean "try later" even without a 5xx status: a 200 stream can carry them.
_UNAVAILABLE_KINDS = frozenset({"overloaded_error", "api_error"})
CHECK_TIMEOUT = 15.0
"""Seconds the start-up check (:meth:`SdkProvider.check`) waits for the models list."""


@dataclass(frozen=True, slots=True)
class SdkErrors:
    """An SDK's exception classes (both official SDKs have the same tree)."""

    base: type[Exception]
    timeout: type[Exception]
    connection: type[Exception]
    status: type[Exception]
    rate_limit: type[Exception]


class SdkProvider(ABC):
    """Constructor state, ``complete`` and the lifecycle of an SDK-backed provider.

    An async context manager; :meth:`aclose` is idempotent. ``params`` are the body fields the
    provider adds to every request (recorded in each call entry); ``stream`` in them decides
    whether the answer is streamed. ``endpoint`` is the origin of the client's resolved base
    URL (the SDK's default, or its environment variable, when none was configured), set by
    the subclass once its client exists: scheme, host and port, so no credential a URL may
    carry travels further.
    """

    name: str
    shape: Shape
    errors: ClassVar[SdkErrors]

    def __init__(self, model: str, params: Mapping[str, Any]) -> None:
        self.model = model
        self.endpoint: str | None = None
        self._params = dict(params)
        self._closed = False

    def params(self) -> Mapping[str, Any]:
        """Body fields sent besides model/system/messages/tools (a fresh copy each call)."""
        return {k: dict(v) if isinstance(v, dict) else v for k, v in self._params.items()}

    async def complete(
        self, request: ProviderRequest, on_text: TextSink | None = None
    ) -> ProviderResponse:
        """Send one request; stream text deltas into ``on_text`` when ``stream`` is set."""
        body = self.encode(request)
        stream = request.params.get("stream") is True
        try:
            result = await self._post(body, stream)
        except self.errors.base as exc:
            raise self._translate(exc, streaming=False) from exc
        if not stream:
            if not isinstance(result, dict):
                raise ProviderError(f"{self.name}: the answer is not a JSON object")
            return self._parse(result)
        async with result, aclosing(self._events(result)) as events:
            return await self._assemble(events, on_text)

    async def check(self) -> None:
        """One cheap authenticated request (the first page of the models list), so a wrong
        key or an unreachable server is known at start, not at the first message. Raises a
        :class:`ProviderError` carrying the status and the API's own message (never the key):
        :func:`providers.check.check_error`. No retries, and a short timeout."""
        try:
            await self._list_models()
        except self.errors.base as exc:
            if isinstance(exc, self.errors.timeout) and _refused(exc):  # as in _translate
                raise ProviderUnavailable(f"{self.name}: could not connect") from exc
            raise check_error(self.name, exc, timeout=self.errors.timeout,
                              connection=self.errors.connection, status=self.errors.status,
                              key=self._key()) from exc

    def encode(self, request: ProviderRequest) -> bytes:
        """The exact bytes :meth:`complete` posts for ``request`` (what replay rebuilds)."""
        return encode_body(request_body(
            self.shape, request.system, request.messages, request.tools, request.model,
            request.params, cache=request.cache, sections=request.sections,
            blobs=request.blobs,
        ))

    async def _events(self, stream: Any) -> AsyncGenerator[Event, None]:
        """The stream's events with transport failures translated; ``on_text``'s own are not."""
        try:
            async for event in stream:
                if isinstance(event, dict):
                    yield event
        except self.errors.base as exc:
            raise self._translate(exc, streaming=True) from exc
        # The SDKs may let the transport's errors escape from stream iteration unwrapped.
        except httpx2.TransportError as exc:
            raise stream_transport_error(self.name, exc) from exc

    # -- what a subclass supplies -------------------------------------------------------------

    @abstractmethod
    async def _post(self, body: bytes, stream: bool) -> Any:
        """POST ``body`` through the SDK client: a JSON value, or the SDK's stream object."""

    @abstractmethod
    def _parse(self, answer: Event) -> ProviderResponse:
        """A whole (non-streamed) answer."""

    @abstractmethod
    async def _assemble(
        self, events: AsyncIterator[Event], on_text: TextSink | None
    ) -> ProviderResponse:
        """The whole answer rebuilt from stream events, text deltas awaited into ``on_text``."""


    @abstractmethod
    async def _list_models(self) -> None:
        """Ask the API for the first page of its models (see :meth:`check`)."""

    @abstractmethod
    def _key(self) -> str | None:
        """The configured API key (cut out of what :meth:`check` reports)."""

    @abstractmethod
    async def _close(self) -> None:
        """Close the SDK client."""

    def _translate(self, exc: Exception, *, streaming: bool) -> ProviderError:
        """The gateway error for an SDK error. Messages carry the status, the error's type and
        the request id, never the API's text: auth errors quote part of the key."""
        name, errors = self.name, self.errors
        if isinstance(exc, errors.timeout) and not _refused(exc):
            return ProviderTimeout(f"{name}: no answer within the timeout")
        if isinstance(exc, errors.connection):
            if streaming:
                return ProviderStreamCut(f"{name}: the stream broke off")
            return ProviderUnavailable(f"{name}: could not connect")
        status = getattr(exc, "status_code", None)
        if isinstance(exc, errors.status) and isinstance(status, int):
            kind = getattr(exc, "code", None) or getattr(exc, "type", None)
            message = f"{name}: HTTP {status}"
            if kind:
                message += f" {kind}"
            request_id = getattr(exc, "request_id", None)
            if request_id:
                message += f" (request id {request_id})"
            # Errors sent inside a 200 stream (event: error) only say what they are in `type`.
            if isinstance(exc, errors.rate_limit) or kind == "rate_limit_error":
                return ProviderRateLimited(message, status=status)
            if status >= 500 or kind in _UNAVAILABLE_KINDS:
                return ProviderUnavailable(message, status=status)
            return ProviderError(message, status=status)
        return ProviderError(f"{name}: {type(exc).__name__}")

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the HTTP client; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        await self._close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def request_url(base_url: httpx2.URL, path: str) -> str:
    """The URL the SDK builds from its base URL and a relative ``path`` (as its
    ``_prepare_url`` does), for a provider to build once: given a relative path, the client
    re-joins it on every request."""
    return str(base_url.copy_with(raw_path=base_url.raw_path + path.lstrip("/").encode()))


def _refused(exc: BaseException) -> bool:
    """Whether an error the SDK calls a timeout was a refused or failed connection.

    The SDKs' aiohttp transport maps every ``ClientConnectionError`` to ``ConnectTimeout``, a
    refused connection included; the cause chain still holds the socket's own ``OSError``
    (a real timeout's is a ``TimeoutError``)."""
    seen: BaseException | None = exc.__cause__ or exc.__context__
    for _ in range(8):  # a short chain; never loop on a cycle
        if seen is None:
            return False
        if isinstance(seen, OSError) and not isinstance(seen, TimeoutError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def count(value: Any) -> int:
    """A token count from an answer: a non-negative int, anything else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def text_or_none(value: Any) -> str | None:
    """A non-empty string from an answer, else None."""
    return value if isinstance(value, str) and value else None


def usage_of(
    *, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0,
    reasoning: int = 0,
) -> dict[str, int]:
    """The outcome's usage in the gateway's one vocabulary (see
    :class:`~gateway.edge.provider.ProviderResponse`); cache and reasoning counts only when
    non-zero, so an uncached call's outcome stays as small as before."""
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if cache_read:
        usage["cache_read_input_tokens"] = cache_read
    if cache_write:
        usage["cache_creation_input_tokens"] = cache_write
    if reasoning:
        usage["reasoning_tokens"] = reasoning
    return usage
