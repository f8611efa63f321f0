"""Stopping a holder the moment its lease may have lapsed, reliably.

A worker serves a conversation only while it holds the conversation's lease. The lease is
trusted until a deadline (the last confirmed extension plus ``LEASE_SAFETY`` of its ttl); the
renewal task moves the deadline on, or ends it at once when Redis says another worker owns the
lease. When the deadline passes (the renewals failed, the process was paused past it with
SIGSTOP, a partition), :class:`LeaseGuard` cancels the serving task.

Why not ``asyncio.timeout``: rescheduling an expiring ``Timeout`` raises (which took the
renewal task, and the worker, down), and on Python 3.11 ``asyncio.wait_for`` (used inside
redis-py and asyncpg) can swallow a cancellation that arrives as its inner call completes
(CPython gh-86296), so a single cancel may be lost. The guard is a plain timer: it cancels, and
cancels again every :data:`RECANCEL_EVERY` seconds until the task has left the guarded block;
:meth:`LeaseGuard.settle` then turns the cancellations it made into :class:`LeaseLostError`,
leaving the task's own cancellation count as it found it (a shutdown's cancel still counts).
:meth:`LeaseGuard.check` is the cheap test before a provider call: a paused worker resumes past
its deadline, and must not start a call before the timer has even had a chance to run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from gateway.edge.coordination import LeaseLostError

RECANCEL_EVERY = 0.1


class LeaseGuard:
    """Cancels ``task`` once ``deadline`` (event-loop time) passes or :meth:`lose` is called."""

    def __init__(self, task: asyncio.Task[object], deadline: float, label: str) -> None:
        self._task = task
        self._loop = task.get_loop()
        self.label = label
        self.deadline = deadline
        self.lost: str | None = None
        self._cancels = 0
        self._inside = True
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(deadline, self._expire)

    def extend(self, deadline: float) -> None:
        """The lease was confirmed: trust it until ``deadline`` (never moves it back)."""
        if self.lost is not None or not self._inside or deadline <= self.deadline:
            return
        self.deadline = deadline
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._expire)

    def lose(self, why: str) -> None:
        """The lease is gone (taken over, or lapsed): stop the task now."""
        if self.lost is not None or not self._inside:
            return
        self.lost = why
        self._cancel()

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the deadline has passed (without cancelling: the
        caller is the task itself, and stops by raising)."""
        if self.lost is None and self._loop.time() >= self.deadline:
            self.lost = "lapsed"
            self._stop_timer()
        if self.lost is not None:
            raise LeaseLostError(f"lease on {self.label} {self.lost}")

    def _expire(self) -> None:
        self._timer = None
        self.lose("lapsed")

    def _cancel(self) -> None:
        self._timer = None
        if not self._inside or self._task.done():
            return
        if self._task.cancel():
            self._cancels += 1
        # Again shortly, in case a wait_for inside the task swallowed this one.
        self._timer = self._loop.call_later(RECANCEL_EVERY, self._cancel)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def settle(self, exc: BaseException | None) -> BaseException | None:
        """Leave the guarded block: what to raise instead of ``exc`` (``None``: nothing).

        A cancellation the guard caused becomes :class:`LeaseLostError`; its cancel requests
        are withdrawn from the task's count, so an outside cancellation (shutdown) still shows.
        """
        self._inside = False
        self._stop_timer()
        cancels, self._cancels = self._cancels, 0
        for _ in range(cancels):
            self._task.uncancel()
        if isinstance(exc, asyncio.CancelledError) and cancels and self._task.cancelling() == 0:
            return LeaseLostError(f"lease on {self.label} {self.lost}")
        return exc


@contextlib.asynccontextmanager
async def guarded(guard: LeaseGuard) -> AsyncIterator[LeaseGuard]:
    """Run the block under ``guard`` (see :meth:`LeaseGuard.settle`)."""
    try:
        yield guard
    except BaseException as exc:
        replaced = guard.settle(exc)
        if replaced is exc or replaced is None:
            raise
        raise replaced from None
    else:
        guard.settle(None)
