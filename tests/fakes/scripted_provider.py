"""A scripted in-process provider: the test and benchmark fake at the provider seam.

Replies come from a queue of assistant messages (or exceptions to raise); when the queue is
empty it answers with ``responder(request)`` if one is given, else ``"ok"``, at once. Every
request it receives is kept, as the body :func:`sessions.shapes.request_body` builds for its
shape, so tests can compare it with replay.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from sessions.records import MessageDict
from sessions.shapes import Shape, request_body

Reply: TypeAlias = str | MessageDict | BaseException


class ScriptedProvider:
    """Provider fake. ``script(...)`` queues replies: a text, a message dict, or an exception.

    A text reply is streamed whole; a message dict's text blocks only with ``stream_blocks``
    (as a real streaming API would), which the older tests did not expect."""

    def __init__(self, *, name: str = "scripted", shape: Shape = "anthropic",
                 model: str = "scripted-1", params: Mapping[str, Any] | None = None,
                 delay: float = 0.0, keep_bodies: bool = True,
                 stream_blocks: bool = False,
                 responder: Callable[[ProviderRequest], Reply] | None = None,
                 endpoint: str | None = None) -> None:
        self.stream_blocks = stream_blocks
        self.responder = responder
        self.requests: list[ProviderRequest] = []
        self.name = name
        self.shape: Shape = shape
        self.model = model
        self.endpoint = endpoint
        self._params = dict(params or {"max_tokens": 256})
        self.delay = delay
        self.keep_bodies = keep_bodies
        self.bodies: list[dict[str, Any]] = []
        self._queue: deque[Reply] = deque()

    def script(self, *replies: Reply) -> None:
        self._queue.extend(replies)

    def params(self) -> Mapping[str, Any]:
        return self._params

    async def complete(self, request: ProviderRequest,
                       on_text: TextSink | None = None) -> ProviderResponse:
        if self.keep_bodies:
            self.bodies.append(request_body(self.shape, request.system, request.messages,
                                            request.tools, request.model, request.params,
                                            cache=request.cache, sections=request.sections,
                                            blobs=request.blobs))
        if self.keep_bodies:
            self.requests.append(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self._queue:
            reply = self._queue.popleft()
        else:
            reply = self.responder(request) if self.responder is not None else "ok"
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, str):
            if on_text is not None:
                await on_text(reply)
            message: MessageDict = {"role": "assistant",
                                    "content": [{"type": "text", "text": reply}]}
        else:
            message = reply
            for block in message["content"] if self.stream_blocks else ():
                if on_text is not None and block.get("type") == "text" and block["text"]:
                    await on_text(block["text"])
        uses = any(b.get("type") == "tool_use" for b in message["content"])
        return ProviderResponse(message=message, stop_reason="tool_use" if uses else "end_turn",
                                usage={"input_tokens": 1, "output_tokens": 1})

    async def aclose(self) -> None:
        return None
