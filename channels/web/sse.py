"""A chat answer as Server-Sent Events: the session, the deltas, files, retracts, the end.

Apart from :mod:`channels.web.channel` because it is the stream's wire format and pacing
(the events are listed in that module's docstring): one JSON object per ``data`` line, a
keepalive comment every :data:`KEEPALIVE_SECONDS` while nothing else is sent, so proxies and
browsers keep a quiet stream open. The deadline is the channel's (its reply timeout and
shutdown), handed in as ``timer`` and ``late``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from channels.web.sink import WebSink
from channels.web.waiting import Pending, session_of
from gateway.edge.channel import Accepted

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0


async def stream(
    request: web.Request, pending: Pending, accepted: Accepted,
    timer: Callable[[Pending], asyncio.Timeout],
    late: Callable[[str | None], tuple[int, dict[str, Any]]],
) -> web.StreamResponse:
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream; charset=utf-8",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",  # reverse proxies must not buffer the stream
    })
    session = accepted.session_id
    try:
        await response.prepare(request)
        try:
            async with timer(pending):
                while session is None and accepted.recorded is not None:
                    # Recorded when its turn starts (several workers).
                    session = await session_of(accepted, pending, KEEPALIVE_SECONDS)
                    if session is None:
                        lost = accepted.recorded.done() and (
                            pending.found is None or pending.found.done())
                        if lost:
                            raise TimeoutError  # its notice was lost: cannot name it
                        await response.write(b": keepalive\n\n")
                if session is not None:  # (a command records nothing: no session)
                    await _event(response, "session", {"session": session})
                await _pump(response, pending.sink, session)
        except TimeoutError:
            status, body = late(session)
            await _event(response, "error", {**body, "status": status})
        await response.write_eof()
    except ConnectionResetError:
        # The browser went away; the turn goes on and its answer is in the history.
        log.debug("web: client left a stream of session %s", session)
    return response


async def _pump(response: web.StreamResponse, sink: WebSink, session: str | None) -> None:
    while True:
        try:
            kind, text = await asyncio.wait_for(sink.events.get(), KEEPALIVE_SECONDS)
        except TimeoutError:
            await response.write(b": keepalive\n\n")
            continue
        named = {} if session is None else {"session": session}
        if kind == "delta":
            await _event(response, "delta", {"text": text})
        elif kind == "retract":
            await _event(response, "retract", {})
        elif kind == "file":
            await _event(response, "file", orjson.loads(text))
        elif kind == "done":
            await _event(response, "done", {**named, "reply": text})
            return
        else:
            await _event(response, "error", {**named, "error": text, "status": 502})
            return


async def _event(response: web.StreamResponse, name: str, data: Mapping[str, Any]) -> None:
    # One JSON object per data line: JSON escapes newlines, so an event is always two lines.
    await response.write(b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")
