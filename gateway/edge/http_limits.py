"""Limits every HTTP endpoint of the gateway applies to a request body: a size cap and a time
limit, both enforced while reading, so a client can neither make us buffer more than the cap
nor hold a handler by sending less than it announced.

aiohttp bounds the request line and headers itself (sizes, counts, and the time to send them:
see :mod:`app.server`); the body is read by the handler, after its cheap checks (a token, a
signature header), through :func:`read_body`. The time limit comes from the application
(:data:`BODY_TIMEOUT`, set by the server from ``GATEWAY_HTTP_TIMEOUT``), so every endpoint on
one server shares it.
"""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import web

DEFAULT_TIMEOUT: Final = 15.0
BODY_TIMEOUT: Final = web.AppKey("gateway_body_timeout", float)
"""Seconds a client has to send a request's body, from when the handler starts reading it."""


class BodyRefused(Exception):
    """A body that was not read whole: too large (413) or too slow (408). The message is safe
    to send back."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def body_timeout(request: web.Request) -> float:
    return request.config_dict.get(BODY_TIMEOUT, DEFAULT_TIMEOUT)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request's body, at most ``limit`` bytes, read within the application's body time
    limit; :class:`BodyRefused` otherwise. A ``Content-Length`` over the limit is refused
    before anything is read."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyRefused(413, f"request body is too large (limit {limit} bytes)")
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(body_timeout(request)):
            async for part in request.content.iter_chunked(64 * 1024):
                size += len(part)
                if size > limit:
                    raise BodyRefused(413, f"request body is too large (limit {limit} bytes)")
                parts.append(part)
    except TimeoutError:
        raise BodyRefused(408, "request body not received in time") from None
    return b"".join(parts)
