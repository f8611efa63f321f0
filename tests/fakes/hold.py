"""Holding a fake platform's outbound methods: the crash trials' way to kill a gateway at a
moment when no reply is half-delivered.

While :meth:`OutboundHold.close` is in effect, a call of a held method (sending or editing a
message) waits before the fake applies it; :meth:`OutboundHold.drop` then answers every waiting
call with an error without applying it (its client was killed: the platform never took the
reply), and :meth:`OutboundHold.open` lets new calls through again. A call that passed the hold
before it closed has been applied (the fakes apply a call without suspending once it runs).
"""

from __future__ import annotations

import asyncio


class Dropped(Exception):
    """A held call the platform never took (answered with an error, not applied)."""


class OutboundHold:
    def __init__(self, methods: frozenset[str]) -> None:
        self.methods = methods
        self._open = asyncio.Event()
        self._open.set()
        self._generation = 0
        self.waiting = 0

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def drop(self) -> None:
        """Fail every call waiting now (never applied), and open again."""
        self._generation += 1
        self._open.set()

    async def passage(self, method: str) -> None:
        """Wait while closed; raise :class:`Dropped` if the wait ended with :meth:`drop`."""
        if method not in self.methods or self._open.is_set():
            return
        generation = self._generation
        self.waiting += 1
        try:
            await self._open.wait()
        finally:
            self.waiting -= 1
        if self._generation != generation:
            raise Dropped(method)
