"""Stopping a task that talks to Redis.

Python 3.11's ``asyncio.wait_for`` loses a cancellation that arrives just as its inner call
completes (CPython gh-86296, fixed in 3.12), and redis-py wraps socket sends in it: a task
cancelled at that moment goes on running. :func:`stop` therefore cancels again until the task
has really ended. It never swallows the caller's own cancellation.
"""

from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_EVERY = 0.5


async def stop(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended (idempotent)."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RECANCEL_EVERY)
