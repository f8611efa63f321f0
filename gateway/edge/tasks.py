"""asyncio helpers of the Redis side: a bound on every command, and stopping a task.

Commands are bounded with ``asyncio.timeout(OP_TIMEOUT)`` here rather than with redis-py's
``socket_timeout``: that one wraps every socket send in ``asyncio.wait_for``, which on Python
3.11 costs a task per command (about a third of a worker's CPU in the workers benchmark).

Python 3.11's ``asyncio.wait_for`` loses a cancellation that arrives just as its inner call
completes (CPython gh-86296, fixed in 3.12), and redis-py wraps socket sends in it: a task
cancelled at that moment goes on running. :func:`stop` therefore cancels again until the task
has really ended. It never swallows the caller's own cancellation.
"""

from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_EVERY = 0.5
OP_TIMEOUT = 5.0
"""Seconds one Redis command (or script, or pipeline) may take before it counts as failed."""


def bounded() -> asyncio.Timeout:
    """``async with bounded():`` around a Redis call; TimeoutError after :data:`OP_TIMEOUT`."""
    return asyncio.timeout(OP_TIMEOUT)


async def stop(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended (idempotent)."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RECANCEL_EVERY)
