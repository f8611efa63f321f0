"""The gate of every ``/api`` route, and the JSON the API answers with.

Apart from :mod:`channels.web.channel` because it is one policy for all the API's routes,
decided before any of them runs: with ``GATEWAY_WEB_TOKEN`` a request needs
``Authorization: Bearer <token>``; without one, a loopback ``Host`` (DNS rebinding) and, when
sent, an ``Origin`` of this server, scheme included (CSRF). Input a route refuses
(:class:`~channels.web.convert.BadRequest`) becomes the one error shape, ``{"error": ...}``,
never a 500.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from channels.web.convert import BadRequest
from gateway.edge.errors import RETRY_AFTER
from gateway.edge.hosts import TrustedProxies, host_of, is_loopback, same_origin


def guard(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    token: bytes | None,
    proxies: TrustedProxies,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def guarded(request: web.Request) -> web.StreamResponse:
        refusal = _refusal(request, token, proxies)
        if refusal is not None:
            return refusal
        try:
            return await handler(request)
        except BadRequest as exc:
            return error(exc.status, str(exc))

    return guarded


def _refusal(request: web.Request, token: bytes | None,
             proxies: TrustedProxies) -> web.Response | None:
    """Why this API request is refused (token, or host/origin checks), if it is."""
    if token is not None:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        given = value.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, token):
            return error(401, "missing or wrong access token",
                         headers={"WWW-Authenticate": "Bearer"})
        return None
    host = request.headers.get("Host", "")
    if not is_loopback(host_of(host)):
        return error(403, "this server answers loopback host names only")
    origin = request.headers.get("Origin")
    scheme = proxies.scheme(request.remote, request.scheme,
                            request.headers.get("X-Forwarded-Proto"))
    if origin is not None and not same_origin(origin, scheme, host):
        return error(403, "cross-origin requests are not allowed")
    return None


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def error(status: int, message: str, headers: Mapping[str, str] | None = None, *,
          retry: bool = False) -> web.Response:
    if retry:
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER)}
    return web.json_response({"error": message}, status=status, headers=headers, dumps=dumps)
