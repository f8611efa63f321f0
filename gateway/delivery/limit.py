"""How many turns a worker runs at once: a fixed number, or derived from what it measures.

A turn spends almost all its time waiting for the model (seconds) and very little on the CPU
(milliseconds), so a worker can run thousands at once: what it must not do is start more
than its CPU can carry, since every turn past that point only makes all of them slower. By
Little's law that point is the model's latency divided by the CPU time a turn costs: with
turns waiting 5 s on the model and 3 ms of CPU each, about 1,700 turns keep one core busy.
``GATEWAY_MAX_CONCURRENT_TURNS=auto`` (the default) sets the limit so, from the worker's own
measurements, every :data:`WINDOW` turns: the time spent waiting for the model per turn (the
provider calls' latency, summed by the caller) over the process CPU time spent per turn,
both over the same window. It starts at :data:`START` (before anything is measured) and
stays within :data:`FLOOR` and :data:`CEILING` (what a turn in flight holds in memory, a few
tens of KB, bounds the top). A turn that waits for a slot waits in arrival order; a limit
that shrinks admits nobody until the turns running drop below it.

Files fetched as a turn starts are not turns: their downloads have a bound of their own
(``GATEWAY_MAX_CONCURRENT_DOWNLOADS``), since each holds up to a file's bytes in memory.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType

START = 256
FLOOR = 64
CEILING = 4096
WINDOW = 200
"""Turns between two derivations of the limit."""
HEADROOM = 1.25
"""The limit is this much above the point where the CPU would be busy all the time: the
measurements are means, and a slot unused costs nothing."""


class TurnLimit:
    """A semaphore whose size is fixed, or derived (see the module docstring). Use as
    ``async with limit:``, and :meth:`observe` each finished turn."""

    def __init__(self, fixed: int | None = None, *, waited: Callable[[], float] = lambda: 0.0,
                 start: int = START, floor: int = FLOOR, ceiling: int = CEILING,
                 window: int = WINDOW, cpu: Callable[[], float] = time.process_time) -> None:
        """``fixed``: that many, never changed; ``None``: derived. ``waited`` reads the
        seconds spent waiting for the model so far (all calls), ``cpu`` the process's CPU
        seconds (every thread's)."""
        if fixed is not None and fixed < 1:
            raise ValueError("a turn limit is at least 1")
        self.fixed = fixed
        self.limit = fixed if fixed is not None else max(floor, min(start, ceiling))
        self._floor, self._ceiling, self._window = floor, ceiling, window
        self._cpu = cpu
        self._running = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._waited = waited
        self._turns = 0
        self._cpu_at = cpu()
        self._waited_at = waited()

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiting if not w.done())

    async def __aenter__(self) -> None:
        if self._running < self.limit and not self.waiting:
            self._running += 1
            return
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(slot)
        try:
            await slot
        except BaseException:
            if slot.done() and not slot.cancelled():
                self._leave()  # admitted just as it was cancelled: give the slot on
            raise
        # (admitted: _admit counted it as running)

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._leave()

    def _leave(self) -> None:
        self._running -= 1
        self._admit()

    def _admit(self) -> None:
        while self._waiting and self._running < self.limit:
            slot = self._waiting.popleft()
            if not slot.done():
                slot.set_result(None)
                self._running += 1

    def observe(self) -> None:
        """One turn ended; every ``window`` turns a derived limit is set again."""
        if self.fixed is not None:
            return
        self._turns += 1
        if self._turns < self._window:
            return
        cpu, waited = self._cpu(), self._waited()
        cpu_per_turn = (cpu - self._cpu_at) / self._turns
        model_per_turn = (waited - self._waited_at) / self._turns
        self._turns, self._cpu_at, self._waited_at = 0, cpu, waited
        if cpu_per_turn <= 0:
            return  # nothing measurable (a clock too coarse): keep the limit
        wanted = math.ceil(model_per_turn / cpu_per_turn * HEADROOM)
        self.limit = max(self._floor, min(wanted, self._ceiling))
        self._admit()
