"""A clock the test moves by hand: the fake at the scheduler's clock seam
(:class:`gateway.schedule.clock.Clock`). Nothing waits on real time."""

from __future__ import annotations

import asyncio


class FakeClock:
    """``now()`` is what the test set; :meth:`advance` moves it and wakes every waiter whose
    deadline has come. :attr:`waiting` is set whenever someone waits (a sign the scheduler
    finished its round and is idle)."""

    def __init__(self, start: float = 1_790_000_000.0) -> None:
        self.t = start
        self._waiters: list[tuple[float, asyncio.Event]] = []
        self.waiting = asyncio.Event()
        self.rounds = 0
        """How many times someone started waiting (each scheduler round ends in one wait)."""

    def now(self) -> float:
        return self.t

    async def wait_until(self, deadline: float, wake: asyncio.Event) -> None:
        if deadline <= self.t or wake.is_set():
            return
        due = asyncio.Event()
        entry = (deadline, due)
        self._waiters.append(entry)
        self.rounds += 1
        self.waiting.set()
        tasks = [asyncio.ensure_future(due.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            if entry in self._waiters:
                self._waiters.remove(entry)

    def advance(self, seconds: float) -> None:
        self.t += seconds
        for deadline, due in list(self._waiters):
            if deadline <= self.t:
                due.set()

    async def idle_after(self, rounds: int, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Wait until a waiter started after ``rounds`` (the scheduler went round again)."""
        async with asyncio.timeout(timeout):
            while self.rounds <= rounds or not self._waiters:
                self.waiting.clear()
                await self.waiting.wait()
