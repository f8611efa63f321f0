"""The provider seam: one small interface in front of every LLM API.

A provider receives the request parts in provider-neutral form and must send exactly the bytes
that :func:`sessions.shapes.encode_body` makes of :func:`sessions.shapes.request_body`'s body
for its shape; that is what lets ``gateway replay --request`` rebuild what the provider
received. ``params()`` are the exact extra body fields it sends (``max_tokens``, ``stream``...);
the agent loop records them in the call entry before the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sessions.records import CachePlan, MessageDict, ToolSchema
from sessions.shapes import Shape

TextSink = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """The parts of one call. ``sections`` are the texts ``system`` is joined from; a
    ``cache`` plan needs them to place its system breakpoint. ``blobs`` holds the bytes of the
    attachments the messages refer to (hash -> bytes), for the shapes to expand."""

    system: str
    messages: Sequence[MessageDict]
    tools: Sequence[ToolSchema]
    model: str
    params: Mapping[str, Any]
    sections: Sequence[str] = ()
    cache: CachePlan | None = None
    blobs: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProviderResponse:
    """The assistant message in stored (Anthropic block) form, plus what the outcome records.

    ``usage`` speaks one vocabulary for every provider: ``input_tokens`` (input neither read
    from nor written to the prompt cache), ``cache_read_input_tokens``,
    ``cache_creation_input_tokens``, ``output_tokens`` (reasoning included) and, when the
    provider reports it, ``reasoning_tokens``. Their sum over the inputs is the whole prompt.
    ``response_id`` and ``response_model`` are what the API said it was (``msg_...``/
    ``chatcmpl-...`` and the exact model version), for tracing; None when it did not say.
    """

    message: MessageDict
    stop_reason: str | None
    usage: Mapping[str, int] = field(default_factory=dict)
    response_id: str | None = None
    response_model: str | None = None


class Provider(Protocol):
    """An LLM API.

    Contract: :meth:`complete` sends one request and returns the whole assistant message; when
    ``on_text`` is given and the provider streams, text deltas are awaited into it as they come.
    Failures are raised as :class:`gateway.edge.errors.ProviderError` subclasses (after the SDK's
    own
    retries) and never hang past the provider's timeout. :meth:`aclose` is idempotent.

    ``endpoint`` is the base URL requests go to (the SDK's default when none is configured),
    or None for a provider that makes no network call. The call entry records only its origin
    (:func:`sessions.endpoint.origin`: scheme, host, port; never userinfo, path or query).
    """

    name: str
    shape: Shape
    model: str

    @property
    def endpoint(self) -> str | None:
        """The base URL requests go to; None when the provider makes no network call."""
        ...

    def params(self) -> Mapping[str, Any]:
        """Body fields sent besides model/system/messages/tools; recorded in the call entry."""
        ...

    async def complete(
        self, request: ProviderRequest, on_text: TextSink | None = None
    ) -> ProviderResponse: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class CheckedProvider(Protocol):
    """A provider that can prove its credentials before any message (the SDK providers).

    Contract: :meth:`check` makes one cheap authenticated request (listing models) and
    returns when the API accepted the key. Otherwise it raises a
    :class:`gateway.edge.errors.ProviderError` whose ``status`` is the HTTP status (401/403: the
    key was refused; None: no answer, :class:`~gateway.edge.errors.ProviderUnavailable` or
    :class:`~gateway.edge.errors.ProviderTimeout`) and whose message carries the API's own
    words, never the key. No retries; it never hangs past a short timeout.
    """

    name: str

    async def check(self) -> None: ...
