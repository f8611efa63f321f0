"""JSON errors for the HTTP API: every error under ``/api/``, and an unknown path or wrong
method anywhere, is ``{"error": "..."}``.

The web chat's own handlers answer their errors as JSON; this middleware covers what they
never see: aiohttp's router answers an unknown path (404) or a wrong method (405, with its
``Allow`` header) before any handler runs, and those came back as plain text, which the page
(and any API client) then failed to parse. Outside ``/api/`` what a handler answers (the page,
webhooks, ``/metrics``, the viewer's pages) keeps its own form; only what no route matched
is turned into JSON there.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_urldispatcher import MatchInfoError

log = logging.getLogger(__name__)

API_PREFIX = "/api/"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_api_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    # An unknown path (or a wrong method) anywhere is the router's answer, before any handler:
    # JSON too, so no client ever gets aiohttp's plain text.
    unrouted = isinstance(request.match_info, MatchInfoError)
    if not request.path.startswith(API_PREFIX) and not unrouted:
        return await handler(request)
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are not errors
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return web.json_response({"error": (exc.reason or "error").lower()}, status=exc.status,
                                 headers=headers)
