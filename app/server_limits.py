"""What the gateway's HTTP server lets a client do before any handler runs, and who may read
its internals (``/metrics`` and the details of ``/healthz``).

Limits (``GATEWAY_HTTP_TIMEOUT``, default 15 s, is the one knob):

* a client has that long to send its request line and headers, from when it connects or from
  its previous response (aiohttp closes an idle or dribbling connection then: its keep-alive
  timer runs from the connection's start);
* request line and each header at most 8190 bytes, at most :data:`MAX_HEADERS` headers and
  :data:`MAX_HEADER_BYTES` of headers in all (431 beyond: aiohttp bounds only each line);
* a body is read by its handler within the same time (:mod:`gateway.edge.http_limits`) and at most
  2 MiB anywhere (each endpoint caps lower where its platform allows);
* a body is never inflated: aiohttp's automatic decompression is off (it inflated a gzip body
  on the event loop as it arrived, on every path, before any handler could check a token), and
  a request that declares a ``Content-Encoding`` other than ``identity`` is answered 415
  before routing reaches a handler. No platform we serve sends compressed requests.

Internals. ``/healthz`` answers everyone with ``{"ok": ...}`` (and 200/503), enough for a load
balancer; the full body (channels, queue depth, coordination) and ``/metrics`` need, with
``GATEWAY_METRICS_TOKEN`` set, ``Authorization: Bearer <token>``; without it, a request from
this machine: a loopback peer address *and* a loopback ``Host`` (a reverse proxy forwarding a
public name, or a DNS-rebinding page, is refused).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.edge.hosts import host_of, is_loopback
from gateway.edge.http_limits import BODY_TIMEOUT

MAX_LINE: Final = 8190
MAX_HEADERS: Final = 48
MAX_HEADER_BYTES: Final = 32 * 1024
MAX_BODY: Final = 2 * 1024 * 1024
LINGER: Final = 2.0
"""Seconds aiohttp keeps reading (and dropping) a body its handler did not read."""


def application(timeout: float, middlewares: Sequence[Middleware] = ()) -> web.Application:
    """The gateway's aiohttp application with the limits above (the header budget runs
    before ``middlewares``)."""
    app = web.Application(client_max_size=MAX_BODY,
                          middlewares=[header_budget, plain_bodies, *middlewares])
    app[BODY_TIMEOUT] = timeout
    return app


def runner_options(timeout: float) -> dict[str, Any]:
    """Keyword arguments of ``web.AppRunner`` (passed on to aiohttp's request handler)."""
    return {"keepalive_timeout": timeout, "max_line_size": MAX_LINE,
            "max_field_size": MAX_LINE, "max_headers": MAX_HEADERS, "lingering_time": LINGER,
            "auto_decompress": False}


@web.middleware
async def header_budget(request: web.Request, handler: Any) -> web.StreamResponse:
    size = sum(len(name) + len(value) + 4 for name, value in request.raw_headers)
    if size > MAX_HEADER_BYTES:
        return web.json_response({"error": "request headers are too large"}, status=431)
    response: web.StreamResponse = await handler(request)
    return response


@web.middleware
async def plain_bodies(request: web.Request, handler: Any) -> web.StreamResponse:
    """415 for a body in a ``Content-Encoding`` (module docstring); its bytes are not read."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        return web.json_response(
            {"error": "compressed request bodies are not accepted (Content-Encoding)"},
            status=415, headers={"Accept-Encoding": "identity"})
    response: web.StreamResponse = await handler(request)
    return response


class InternalAccess:
    """Who may read ``/metrics`` and the details of ``/healthz`` (module docstring)."""

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    def refusal(self, request: web.Request) -> web.Response | None:
        """None when the request may read internals, else the answer to give it."""
        if self._token is not None:
            scheme, _, value = request.headers.get("Authorization", "").partition(" ")
            given = value.strip().encode("utf-8", "surrogateescape")
            if scheme.lower() == "bearer" and hmac.compare_digest(given, self._token):
                return None
            return web.json_response({"error": "missing or wrong metrics token"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        if is_loopback(request.remote or "") and is_loopback(
                host_of(request.headers.get("Host", ""))):
            return None
        return web.json_response({"error": "served to this machine only (or set "
                                           "GATEWAY_METRICS_TOKEN)"}, status=403)
