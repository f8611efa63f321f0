"""The scheduler's clock: what time it is, and waiting until a time (or until woken).

A seam so that tests move time forward by hand (``tests/fakes/clock.py``) instead of
sleeping: every decision the scheduler makes (is it due, is it late, how long to wait) reads
this clock, never ``time.time`` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    """Contract: :meth:`now` is Unix seconds; :meth:`wait_until` returns once ``deadline``
    has passed on this clock or ``wake`` is set (whichever first; it does not clear it)."""

    def now(self) -> float: ...

    async def wait_until(self, deadline: float, wake: asyncio.Event) -> None: ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    async def wait_until(self, deadline: float, wake: asyncio.Event) -> None:
        delay = deadline - time.time()
        if delay <= 0 or wake.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await wake.wait()
