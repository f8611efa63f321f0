"""One chat request waiting for its answer, and where it finds the answer and its session.

Apart from :mod:`channels.web.channel` because it is the part of a request that outlives the
worker serving it: with several workers the reply is relayed from whichever serves the
conversation, and the relay can lose it (Redis restarted or flushed, the serving worker
killed). So besides its sink and the record's notice, a waiting request looks its answer up in
the session log now and then (:func:`looking_up`), and takes its session from whichever of
the two comes first (:func:`session_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from channels.web.sink import WebSink
from gateway.edge.channel import Accepted, Answer

log = logging.getLogger(__name__)

LOST_REPLY_CHECK = 1.0
"""Seconds between looks in the session log for the answer to a request whose reply comes from
another worker (relayed through Redis, which can lose it, or from a worker that died right
after recording it): found recorded there, it is sent, whether or not the item is marked
answered yet. So a waiting request gets a recorded answer within two looks of its recording,
whatever became of the relay."""


@dataclass(slots=True)
class Pending:
    sink: WebSink
    timer: asyncio.Timeout | None = None
    found: asyncio.Future[str] | None = None
    """The session the answer was found recorded in (see :func:`_look_up`)."""


@contextlib.asynccontextmanager
async def looking_up(pending: Pending, accepted: Accepted,
                     every: float) -> AsyncIterator[None]:
    """While the request waits, look its answer up in the log now and then, where the
    reply is relayed from another worker (``accepted.answered``)."""
    if accepted.answered is None:
        yield
        return
    pending.found = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(_look_up(pending, accepted.answered, every))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _look_up(pending: Pending, answered: Callable[[float], Awaitable[Answer | None]],
                   every: float) -> None:
    """Until the answer is found recorded: then name its session (``pending.found``) and
    send it, unless the relayed reply came first. Without this, a reply lost on its way
    (Redis restarted or flushed) left the request waiting for ``reply_timeout``."""
    assert pending.found is not None
    while True:
        await asyncio.sleep(every)
        try:
            answer = await answered(0)
        except Exception as exc:  # the store is away: look again later
            log.debug("web: looking an answer up failed (%s)", type(exc).__name__)
            continue
        if answer is None:
            continue
        if not pending.found.done():
            pending.found.set_result(answer.session_id)
        if answer.ok:
            await pending.sink.finish(answer.text)
        else:
            await pending.sink.fail(answer.text)
        return


async def session_of(accepted: Accepted, pending: Pending, within: float) -> str | None:
    """The session the message was recorded in: from its record's notice, or from the log
    where that notice was lost (``pending.found``); ``None`` if neither came in time."""
    if accepted.session_id is not None:
        return accepted.session_id
    for future in (accepted.recorded, pending.found):
        if future is not None and future.done() and not future.cancelled():
            return future.result()
    # A cancelled notice (the relay forgot it) is no longer waited for; the log still may be.
    waits = [f for f in (accepted.recorded, pending.found) if f is not None and not f.done()]
    if not waits:
        return None
    # The first to come: the log is looked at too, and may never have it.
    done, _ = await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    for future in done:
        if not future.cancelled():
            return future.result()
    return None
